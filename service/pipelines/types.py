"""The type grammar of pipeline definitions: Iceberg type names, with list<...>, map<...,...>
and struct<name: ...> written inline, and which of them Calve can write."""

from __future__ import annotations

import re

from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

EXTRA_FIELDS_TYPE = "map<string,string>"  # a sink's extra_fields column

_PRIMITIVES: dict[str, IcebergType] = {
    "boolean": BooleanType(), "int": IntegerType(), "long": LongType(), "float": FloatType(),
    "double": DoubleType(), "date": DateType(), "time": TimeType(), "timestamp": TimestampType(),
    "timestamptz": TimestamptzType(), "string": StringType(), "uuid": UUIDType(), "binary": BinaryType(),
}


TYPE_HELP = (
    "boolean, int, long, float, double, decimal(P,S), date, time, timestamp, timestamptz, string, "
    "binary, list<T>, map<K,V>, struct<name: T, ...> (not uuid or fixed[N]: store them as string or binary)"
)


class _TypeParser:
    """Iceberg type names, with nested list<...>, map<...,...>, struct<name: ...> written inline."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.next_id = 1000  # nested field ids are reassigned when the table is created

    def parse(self) -> IcebergType:
        parsed = self._type()
        self._skip()
        if self.pos != len(self.text):
            raise ValueError(f"unexpected {self.text[self.pos:]!r}")
        return parsed

    def _skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def _word(self) -> str:
        self._skip()
        match = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\(\s*\d+\s*,\s*\d+\s*\)|\[\s*\d+\s*\])?").match(self.text, self.pos)
        if not match:
            raise ValueError(f"expected a type at {self.text[self.pos:]!r}")
        self.pos = match.end()
        return match.group(0)

    def _expect(self, char: str) -> None:
        self._skip()
        if self.text[self.pos:self.pos + 1] != char:
            raise ValueError(f"expected {char!r} at {self.text[self.pos:]!r}")
        self.pos += 1

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id

    def _type(self) -> IcebergType:
        word = self._word()
        lowered = re.sub(r"\s+", "", word.lower())
        if lowered in ("list", "map", "struct"):
            self._expect("<")
            if lowered == "list":
                element = self._type()
                self._expect(">")
                return ListType(self._id(), element, element_required=False)
            if lowered == "map":
                key = self._type()
                self._expect(",")
                value = self._type()
                self._expect(">")
                return MapType(self._id(), key, self._id(), value, value_required=False)
            fields = []
            while True:
                name = self._word()
                self._expect(":")
                fields.append(NestedField(self._id(), name, self._type(), required=False))
                self._skip()
                if self.text[self.pos:self.pos + 1] == ",":
                    self.pos += 1
                    continue
                self._expect(">")
                return StructType(*fields)
        if lowered in _PRIMITIVES:
            return _PRIMITIVES[lowered]
        decimal = re.fullmatch(r"decimal\((\d+),(\d+)\)", lowered)
        if decimal:
            precision, scale = int(decimal.group(1)), int(decimal.group(2))
            if not 1 <= precision <= 38 or scale > precision:
                raise ValueError(f"decimal({precision},{scale}): precision 1 to 38, scale at most the precision")
            return DecimalType(precision, scale)
        fixed = re.fullmatch(r"fixed\[(\d+)\]", lowered)
        if fixed and int(fixed.group(1)) > 0:
            return FixedType(int(fixed.group(1)))
        raise ValueError(f"unknown type {word!r}; use one of {TYPE_HELP}")


def parse_type(text: str) -> IcebergType:
    return _TypeParser(text).parse()


UNSUPPORTED = (UUIDType, FixedType)


def check_writable(column_type: IcebergType) -> None:
    """Types Spark cannot write as Iceberg expects them (no UUID or FIXED in its Parquet)."""
    if isinstance(column_type, UNSUPPORTED):
        raise ValueError(
            f"{column_type} columns are not supported: Spark writes no Parquet UUID or fixed-length binary; use string (uuid) or binary (fixed)"
        )
    if isinstance(column_type, StructType):
        for field in column_type.fields:
            check_writable(field.field_type)
    elif isinstance(column_type, ListType):
        check_writable(column_type.element_type)
    elif isinstance(column_type, MapType):
        check_writable(column_type.key_type)
        check_writable(column_type.value_type)


def is_extra_fields_type(column_type: IcebergType) -> bool:
    return isinstance(column_type, MapType) and column_type.key_type == StringType() and column_type.value_type == StringType()


def parse_type_numbered(text: str, after_id: int) -> tuple[IcebergType, int]:
    """The type with its nested fields numbered after `after_id`, and the last id it used."""
    parser = _TypeParser(text)
    parser.next_id = after_id
    return parser.parse(), parser.next_id
