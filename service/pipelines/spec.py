"""What a pipeline definition may say, checked before it is stored (no I/O here).

A definition is YAML or JSON:

    name: checkout
    source: {http: {path: /checkout}}
    processors:                       # in order, as Spark SQL over the events
      - where: "status IS NOT NULL"
      - set: {amount_eur: "amount / 100.0"}
      - drop: [debug]
      - rename: {svc: service}
    routes:                           # named conditions
      errors: "status >= 500"
    sinks:
      - table: checkout_errors        # static, or dynamic: "${service}_events"
        routes: [errors]              # no routes: every event
        auto_create: true
        schema:
          columns: [{name: ts, type: timestamptz, required: true}, {name: status, type: int}]
          partition_spec: [{column: ts, transform: day}]
        schema_evolution: false
        extra_fields: extra           # a map<string,string> column keeps the fields no column takes
        commit_interval: 5            # seconds
        target_file_size: 134217728   # bytes (compaction's target too)
        snapshot_max_age: 86400       # seconds of snapshots kept (time travel)
        snapshot_max_count: 500
      - table: customers              # row-level changes instead of appends (copy-on-write)
        operation: "op"               # a Spark SQL expression: insert|i|c|r|index|create, update|u, delete|d
        identifier_columns: [id]      # the row's key (required columns): the table's identifier fields
        mode: upsert                  # or append (default): an update of a missing key is then a no-op

Expressions are parsed with sqlglot's Spark dialect and may call only the functions in
ALLOWED_FUNCTIONS: ones that read the event (and the clock) and cannot fail or flood on purpose.
They run on a Spark shared by all tenants: no reflection, files, session or catalog facts
(`user()`, `version()`, `current_database()`), `raise_error`/`assert_true`, generators,
aggregates, or functions whose output size an event can choose (`repeat`, `sequence`, `space`).
A definition is bounded too: MAX_PROCESSORS, MAX_ROUTES, MAX_SINKS, expressions of at most
MAX_EXPRESSION_LENGTH characters nested at most MAX_EXPRESSION_DEPTH parentheses deep.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import sqlglot
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import parse_transform
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
    PrimitiveType,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)
from sqlglot import exp
from sqlglot.tokens import TokenType

from service.core.exceptions import DefinitionInvalid, SpecError
from service.core.keys import DLQ_TABLE, RESERVED_TABLE_PREFIX
from service.tenancy.names import RULE, is_valid_name

DYNAMIC_FIELD = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_.]*)\}")
PATH_PATTERN = re.compile(r"^/[a-z0-9_\-]+(/[a-z0-9_\-]+)*$")
# Calve's own endpoints, and the shippers' protocols (/_bulk and /{index}/_bulk are Elasticsearch's).
RESERVED_PATH_PREFIXES = ("/v1", "/healthz", "/readyz", "/metrics", "/docs", "/openapi", "/redoc", "/otlp", "/loki", "/_bulk")
MAX_PROCESSORS = 100
MAX_ROUTES = 50
MAX_SINKS = 20
MAX_EXPRESSION_LENGTH = 4000
MAX_EXPRESSION_DEPTH = 32  # parentheses; also keeps sqlglot's recursive parser far from its limit
# Spark SQL functions an expression may call: each reads only its arguments (or the clock, or a
# random source) and its output grows at most with its input.
ALLOWED_FUNCTIONS = frozenset("""
    ascii base64 unbase64 bit_length btrim char chr char_length character_length concat concat_ws contains
    decode encode endswith startswith find_in_set format_number format_string printf initcap instr lcase
    lower ucase upper left right length len levenshtein locate position ltrim rtrim trim octet_length
    overlay regexp_count regexp_extract regexp_extract_all regexp_instr regexp_like regexp_replace
    regexp_substr replace reverse soundex split split_part substr substring substring_index translate
    to_binary to_char to_varchar to_number try_to_number url_decode url_encode try_url_decode parse_url
    mask md5 sha sha1 sha2 crc32 hash xxhash64 luhn_check elt like ilike rlike hex unhex bin conv uuid
    abs acos acosh asin asinh atan atan2 atanh bround cbrt ceil ceiling cos cosh cot csc degrees e exp
    expm1 factorial floor greatest least ln log log10 log1p log2 mod pmod negative positive pi pow power
    radians rint round sec shiftleft shiftright shiftrightunsigned sign signum sin sinh sqrt tan tanh
    try_add try_divide try_multiply try_subtract try_mod width_bucket div nanvl isnan rand random randn
    coalesce if ifnull nullif nvl nvl2 isnull isnotnull nullifzero zeroifnull equal_null
    cast try_cast boolean int integer bigint smallint tinyint double float string date timestamp decimal
    binary to_date to_timestamp to_timestamp_ltz to_timestamp_ntz try_to_timestamp to_unix_timestamp
    to_utc_timestamp from_utc_timestamp unix_timestamp from_unixtime timestamp_seconds timestamp_millis
    timestamp_micros unix_seconds unix_millis unix_micros unix_date date_from_unix_date
    add_months current_date current_timestamp now localtimestamp current_timezone date_add dateadd
    date_diff datediff date_format date_part datepart date_sub date_trunc trunc day dayofmonth dayofweek
    dayofyear extract hour minute second month quarter year week weekday weekofyear last_day next_day
    make_date make_timestamp make_interval months_between timestampadd timestampdiff try_make_timestamp
    convert_timezone
    array array_contains array_distinct array_except array_intersect array_join array_max array_min
    array_position array_remove array_union arrays_overlap arrays_zip array_sort sort_array array_compact
    array_append array_prepend array_insert array_size cardinality size element_at try_element_at get
    slice flatten shuffle filter transform exists forall aggregate reduce zip_with map map_concat
    map_contains_key map_entries map_filter map_from_arrays map_from_entries map_keys map_values
    map_zip_with str_to_map transform_keys transform_values named_struct struct get_json_object
    from_json to_json json_array_length json_object_keys schema_of_json typeof bit_count bit_get getbit
""".split())
# SQL words that an opening parenthesis may follow without being a function call.
_KEYWORDS_BEFORE_PAREN = frozenset({"and", "or", "not", "in", "when", "then", "else", "case", "is", "between", "like", "rlike", "ilike", "distinct", "interval"})
TIME_TRANSFORMS = ("year", "month", "day", "hour")
INTERNAL_PREFIX = "_calve"  # the job's own columns (receipt, event text, routes): never the user's
MAX_BUCKETS = 2**31 - 1
MAX_FILE_SIZE = 2**34  # 16 GiB
MAX_IDENTIFIER_COLUMNS = 8
MIN_FILE_SIZE = 2**20  # 1 MiB
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

# -- types ----------------------------------------------------------------------------------


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


def _check_writable(column_type: IcebergType) -> None:
    """Types Spark cannot write as Iceberg expects them (no TIME, UUID or FIXED in its Parquet)."""
    if isinstance(column_type, UNSUPPORTED):
        raise ValueError(
            f"{column_type} columns are not supported: Spark writes no Parquet UUID or fixed-length binary; use string (uuid) or binary (fixed)"
        )
    if isinstance(column_type, StructType):
        for field in column_type.fields:
            _check_writable(field.field_type)
    elif isinstance(column_type, ListType):
        _check_writable(column_type.element_type)
    elif isinstance(column_type, MapType):
        _check_writable(column_type.key_type)
        _check_writable(column_type.value_type)


# -- expressions ----------------------------------------------------------------------------


def check_expression(text: str) -> str:
    """A single Spark SQL expression over the event's fields, or ValueError saying why not."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("an expression is needed")
    if len(text) > MAX_EXPRESSION_LENGTH:
        raise ValueError(f"an expression may have at most {MAX_EXPRESSION_LENGTH} characters")
    try:
        tokens = sqlglot.tokenize(text, read="spark")
    except sqlglot.errors.SqlglotError as exc:
        raise ValueError(f"not a Spark SQL expression: {str(exc).splitlines()[0]}") from None
    _check_calls(tokens)
    try:
        parsed = sqlglot.parse(text, read="spark")
    except sqlglot.errors.SqlglotError as exc:
        raise ValueError(f"not a Spark SQL expression: {str(exc).splitlines()[0]}") from None
    except RecursionError:
        raise ValueError("the expression is nested too deeply") from None
    if len(parsed) != 1 or parsed[0] is None:
        raise ValueError("one expression, not several statements")
    tree = parsed[0]
    if isinstance(tree, (exp.Query, exp.DDL, exp.DML, exp.Command)) or tree.find(exp.Query, exp.Table):
        raise ValueError("an expression over the event's fields; queries and tables are not allowed")
    if tree.find(exp.AggFunc, exp.Window):
        raise ValueError("aggregate and window functions work across events; an expression reads one event")
    for column in tree.find_all(exp.Column):
        if column.name.lower().startswith(INTERNAL_PREFIX):
            raise ValueError(f"names starting with {INTERNAL_PREFIX!r} are Calve's own (receipts, routing)")
    return text


def _check_calls(tokens: list) -> None:  # noqa: ANN001 - sqlglot tokens
    """Every word followed by '(' is an allowed function (checked on the tokens, as written: the
    parsed tree renames many functions), and parentheses nest at most MAX_EXPRESSION_DEPTH deep."""
    depth = 0
    for index, token in enumerate(tokens):
        if token.token_type == TokenType.L_PAREN:
            depth += 1
            if depth > MAX_EXPRESSION_DEPTH:
                raise ValueError(f"the expression nests parentheses more than {MAX_EXPRESSION_DEPTH} deep")
            if index and tokens[index - 1].token_type not in (TokenType.L_PAREN, TokenType.COMMA):
                name = tokens[index - 1].text.lower()
                if name.isidentifier() and name not in _KEYWORDS_BEFORE_PAREN and name not in ALLOWED_FUNCTIONS:
                    raise ValueError(f"function {name}() is not allowed in pipeline expressions "
                                     "(expressions may call only functions that read the event; the README lists them)")
        elif token.token_type == TokenType.R_PAREN:
            depth -= 1


Expression = Annotated[str, Field(min_length=1, max_length=MAX_EXPRESSION_LENGTH)]

# -- the definition -------------------------------------------------------------------------


# A table-sourced pipeline's events carry their change here (insert or delete; an update is the
# insert of its new row): the default operation of its sinks with identifier columns.
FEED_OPERATION = "_change_type"


def is_reserved_path(path: str) -> bool:
    """Whether `path` is one of Calve's own endpoints or a shipper protocol's, at or under a
    reserved segment (`/otlp/v1/logs`, not `/otlp_events`)."""
    return any(path == prefix or path.startswith(prefix + "/") for prefix in RESERVED_PATH_PREFIXES) or path.endswith("/_bulk")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class HttpSource(_Strict):
    path: str

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        if not PATH_PATTERN.fullmatch(value) or len(value) > 200:
            raise ValueError("a path like /checkout or /team/events: lower-case letters, digits, '_', '-' and '/'")
        if is_reserved_path(value):
            raise ValueError(f"{value} is reserved for Calve's own endpoints")
        return value


class Source(_Strict):
    """Where a pipeline's events come from: HTTP requests to a path, or the change feed of one of
    the tenant's tables (each changed row an event, its change as the operation)."""

    http: HttpSource | None = None
    table: str | None = Field(default=None, description="a table of the tenant whose changes flow through this pipeline")
    initial_load: bool = Field(default=True, description="with table: read the table whole first, then its changes")

    @field_validator("table")
    @classmethod
    def _table(cls, value: str | None) -> str | None:
        if value is not None and not is_valid_name(value):
            raise ValueError(f"invalid table name {value!r}: use {RULE}")
        return value

    @model_validator(mode="after")
    def _one(self) -> Source:
        if (self.http is None) == (self.table is None):
            raise ValueError("give exactly one of http (a path) and table (a table's change feed)")
        return self


class Processor(_Strict):
    """Exactly one of: where (keep matching rows), set, drop, rename."""

    where: Expression | None = None
    set: dict[str, Expression] | None = None
    drop: list[str] | None = None
    rename: dict[str, str] | None = None

    @model_validator(mode="after")
    def _one(self) -> Processor:
        given = [name for name in ("where", "set", "drop", "rename") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError("each processor is exactly one of where, set, drop, rename")
        if self.where is not None:
            check_expression(self.where)
        for column, expression in (self.set or {}).items():
            _column_name(column)
            check_expression(expression)
        for column in self.drop or []:
            _column_name(column)
        for old, new in (self.rename or {}).items():
            _column_name(old)
            _column_name(new)
        return self

    @property
    def kind(self) -> str:
        return next(name for name in ("where", "set", "drop", "rename") if getattr(self, name) is not None)


def is_extra_fields_type(column_type: IcebergType) -> bool:
    return isinstance(column_type, MapType) and column_type.key_type == StringType() and column_type.value_type == StringType()


def _column_name(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", name):
        raise ValueError(f"invalid column name {name!r}: letters, digits and '_', not starting with a digit")
    if name.lower().startswith(INTERNAL_PREFIX):
        raise ValueError(f"names starting with {INTERNAL_PREFIX!r} are Calve's own (receipts, routing)")
    return name


class Column(_Strict):
    name: str
    type: str
    required: bool = False
    doc: str | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return _column_name(value)

    @field_validator("type")
    @classmethod
    def _type(cls, value: str) -> str:
        _check_writable(parse_type(value))
        return value

    def iceberg_type(self) -> IcebergType:
        return parse_type(self.type)


class PartitionFieldSpec(_Strict):
    column: str
    transform: str = "identity"

    @field_validator("transform")
    @classmethod
    def _transform(cls, value: str) -> str:
        value = value.strip().lower()
        if value in ("identity", *TIME_TRANSFORMS):
            return value
        match = re.fullmatch(r"(bucket|truncate)\[(\d+)\]", value)
        if match and 0 < int(match.group(2)) <= MAX_BUCKETS:
            return value
        raise ValueError(f"unknown transform {value!r}; use identity, year, month, day, hour, bucket[N] or truncate[N]")


class TableSchema(_Strict):
    columns: list[Column] = Field(min_length=1)
    partition_spec: list[PartitionFieldSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> TableSchema:
        names = [column.name for column in self.columns]
        duplicated = sorted({name for name in names if names.count(name) > 1})
        if duplicated:
            raise ValueError(f"columns named twice: {duplicated}")
        types = {column.name: column.iceberg_type() for column in self.columns}
        for index, field in enumerate(self.partition_spec):
            if field.column not in types:
                raise ValueError(f"partition_spec[{index}]: no column {field.column!r} in the schema")
            column_type = types[field.column]
            if not isinstance(column_type, PrimitiveType):
                raise ValueError(f"partition_spec[{index}]: {field.column!r} is {column_type}; partition on a primitive column")
            if field.transform in TIME_TRANSFORMS and not isinstance(column_type, (DateType, TimestampType, TimestamptzType)):
                raise ValueError(f"partition_spec[{index}]: {field.transform} needs a date or timestamp column, {field.column!r} is {column_type}")
            if field.transform.startswith("truncate") and not isinstance(column_type, (IntegerType, LongType, StringType, BinaryType)):
                raise ValueError(f"partition_spec[{index}]: truncate needs an int, long, string or binary column")
            bucketable = (IntegerType, LongType, DateType, TimestampType, TimestamptzType, StringType, BinaryType)
            if field.transform.startswith("bucket") and not isinstance(column_type, bucketable):
                raise ValueError(f"partition_spec[{index}]: bucket needs an int, long, date, timestamp, string or binary column")
        return self

    def iceberg_schema(self) -> Schema:
        """Top-level ids 1..n, nested ids after them (the catalog assigns its own on creation anyway)."""
        next_id = len(self.columns)
        fields = []
        for index, column in enumerate(self.columns, start=1):
            parser = _TypeParser(column.type)
            parser.next_id = next_id
            fields.append(NestedField(index, column.name, parser.parse(), required=column.required, doc=column.doc))
            next_id = parser.next_id
        return Schema(*fields)

    def iceberg_partition_spec(self, schema: Schema) -> PartitionSpec:
        return PartitionSpec(*[
            PartitionField(
                source_id=schema.find_field(field.column).field_id, field_id=1000 + index,
                transform=parse_transform(field.transform), name=f"{field.column}_{field.transform.split('[')[0]}",
            )
            for index, field in enumerate(self.partition_spec)
        ])


class Sink(_Strict):
    table: str
    routes: list[str] = Field(default_factory=list)
    auto_create: bool = False
    schema_: TableSchema | None = Field(default=None, alias="schema")
    schema_evolution: bool = False
    # The map<string, string> column that keeps each event's top-level fields no other column
    # takes (values as JSON text, strings as they are): nothing is dropped, no column is added.
    extra_fields: str | None = Field(default=None, description="column keeping the fields no other column takes")
    commit_interval: float | None = Field(default=None, gt=0, le=3600, description="seconds between commits")
    target_file_size: int | None = Field(default=None, ge=MIN_FILE_SIZE, le=MAX_FILE_SIZE, description="bytes")
    snapshot_max_age: float | None = Field(default=None, gt=0, le=365 * 86400, description="seconds of history the table keeps")
    snapshot_max_count: int | None = Field(default=None, ge=1, le=100_000, description="snapshots the table keeps at most")
    # Row-level changes (copy-on-write): see OPERATIONS.
    operation: Expression | None = Field(default=None, description="Spark SQL expression: each event's operation (insert, update, delete)")
    identifier_columns: list[str] | None = Field(default=None, min_length=1, max_length=MAX_IDENTIFIER_COLUMNS, description="the row's key")
    mode: Literal["append", "upsert"] = Field(default="append", description="upsert: every event replaces the row with its key")

    @property
    def row_changes(self) -> bool:
        """Events change rows by key (copy-on-write) instead of being appended."""
        return self.operation is not None or self.mode == "upsert"

    @field_validator("table")
    @classmethod
    def _table(cls, value: str) -> str:
        if DYNAMIC_FIELD.search(value):
            # The fixed parts must be valid on their own, so no event value can smuggle in a dot or slash.
            fixed = DYNAMIC_FIELD.sub("x", value)
            if not is_valid_name(fixed):
                raise ValueError(f"the fixed parts of {value!r} must follow the table name rule: {RULE}")
            return value
        if not is_valid_name(value):
            raise ValueError(f"invalid table name {value!r}: use {RULE}")
        if value.startswith(RESERVED_TABLE_PREFIX):
            raise ValueError(f"table names starting with {RESERVED_TABLE_PREFIX!r} are Calve's own (the DLQ is {DLQ_TABLE})")
        return value

    @field_validator("extra_fields")
    @classmethod
    def _extra_fields(cls, value: str | None) -> str | None:
        return None if value is None else _column_name(value)

    @property
    def dynamic(self) -> bool:
        return bool(DYNAMIC_FIELD.search(self.table))

    @property
    def table_fields(self) -> list[str]:
        return DYNAMIC_FIELD.findall(self.table)

    @model_validator(mode="after")
    def _dynamic_has_no_schema(self) -> Sink:
        if self.dynamic and self.schema_ is not None:
            raise ValueError("a dynamic table name cannot have a schema: each resolved table infers its own from its first batch")
        return self


class PipelineDefinition(_Strict):
    name: str
    source: Source
    processors: list[Processor] = Field(default_factory=list, max_length=MAX_PROCESSORS)
    routes: dict[str, Expression] = Field(default_factory=dict, max_length=MAX_ROUTES)
    sinks: list[Sink] = Field(min_length=1, max_length=MAX_SINKS)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not is_valid_name(value):
            raise ValueError(f"invalid pipeline name {value!r}: use {RULE}")
        return value

    @field_validator("routes")
    @classmethod
    def _routes(cls, value: dict[str, str]) -> dict[str, str]:
        for name, expression in value.items():
            if not is_valid_name(name):
                raise SpecError(f"routes.{name}", f"invalid route name: use {RULE}")
            try:
                check_expression(expression)
            except ValueError as exc:
                raise SpecError(f"routes.{name}", str(exc)) from None
        return value

    @model_validator(mode="after")
    def _row_changes(self) -> PipelineDefinition:
        for index, sink in enumerate(self.sinks):
            where = f"sinks[{index}]"
            if self.source.table is not None:
                if sink.table == self.source.table:
                    raise SpecError(f"{where}.table", "a pipeline cannot write the table whose changes it reads")
                if sink.operation is None and sink.identifier_columns is not None:
                    sink.operation = FEED_OPERATION  # the copy follows the source's changes, deletes included
            if sink.operation is not None:
                try:
                    check_expression(sink.operation)
                except ValueError as exc:
                    raise SpecError(f"{where}.operation", str(exc)) from None
            if sink.identifier_columns is None:
                if sink.row_changes and sink.auto_create:
                    raise SpecError(f"{where}.identifier_columns", "required with operation or mode: upsert when the sink may "
                                    "create the table (they become its identifier fields)")
                continue
            if not sink.row_changes:
                raise SpecError(f"{where}.identifier_columns", "only meaningful with operation or mode: upsert")
            names = sink.identifier_columns
            if len(set(names)) != len(names):
                raise SpecError(f"{where}.identifier_columns", f"a column is named twice: {names}")
            for name in names:
                if not is_valid_name(name):
                    raise SpecError(f"{where}.identifier_columns", f"invalid column name {name!r}: use {RULE}")
            if sink.schema_ is not None:
                columns = {column.name: column for column in sink.schema_.columns}
                for name in names:
                    column = columns.get(name)
                    if column is None:
                        raise SpecError(f"{where}.identifier_columns", f"no column {name!r} in the schema")
                    if not column.required:
                        raise SpecError(f"{where}.identifier_columns", f"column {name!r} must be required: true to identify rows")
                    if not isinstance(column.iceberg_type(), PrimitiveType) or isinstance(column.iceberg_type(), (FloatType, DoubleType)):
                        raise SpecError(f"{where}.identifier_columns", f"column {name!r} is {column.type}; an identifier must be a "
                                        "primitive type other than float and double")
        return self

    @model_validator(mode="after")
    def _extra_fields(self) -> PipelineDefinition:
        for index, sink in enumerate(self.sinks):
            name, where = sink.extra_fields, f"sinks[{index}].extra_fields"
            if name is None:
                continue
            if name in (sink.identifier_columns or ()):
                raise SpecError(where, f"column {name!r} identifies rows (identifier_columns); name another column")
            declared = {column.name: column for column in sink.schema_.columns} if sink.schema_ is not None else {}
            column = declared.get(name)
            if column is not None and (column.required or not is_extra_fields_type(column.iceberg_type())):
                raise SpecError(where, f"the schema declares column {name!r} as {column.type}{' (required)' if column.required else ''}: "
                                f"leave it out of the schema or declare it an optional {EXTRA_FIELDS_TYPE}")
        return self

    @model_validator(mode="after")
    def _sink_routes_exist(self) -> PipelineDefinition:
        for index, sink in enumerate(self.sinks):
            for route in sink.routes:
                if route not in self.routes:
                    raise SpecError(f"sinks[{index}].routes", f"no route named {route!r} (routes: {sorted(self.routes)})")
        return self


def field_path(loc: tuple[Any, ...]) -> str:
    """('sinks', 0, 'schema', 'columns', 1, 'type') -> 'sinks[0].schema.columns[1].type'."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += ("." if text else "") + str(part)
    return text or "definition"


def parse_definition(data: Any) -> PipelineDefinition:
    """The definition, or SpecErrors (as a list) naming each bad field."""
    if not isinstance(data, dict):
        raise DefinitionInvalid([SpecError("definition", "a mapping (YAML or JSON object) is expected")])
    try:
        return PipelineDefinition.model_validate(data)
    except ValidationError as exc:
        errors = []
        for error in exc.errors():
            loc = tuple(part for part in error["loc"] if not (isinstance(part, str) and "[" in part))
            message = error["msg"].removeprefix("Value error, ")
            if isinstance(error.get("ctx", {}).get("error"), SpecError):
                spec_error = error["ctx"]["error"]
                errors.append(SpecError(spec_error.field, spec_error.message))
                continue
            errors.append(SpecError(field_path(loc), message))
        raise DefinitionInvalid(errors) from None
