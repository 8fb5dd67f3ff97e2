"""Per-event conversion of parsed JSON to a table's types, as Spark column expressions.

Every conversion gives a value and an `ok` flag: `ok` is false when the event had a value that
cannot be converted (the value becomes NULL). The job decides what that means: NULL in an
optional column, the DLQ for a required one.

Accepted values per target type (JSON numbers, strings and booleans alike are read as text first,
so "12" and 12 convert the same way):

    int, long       integers, and numbers with no fraction ("12", 12, 12.0, "1e3")
    float, double   any number
    decimal(P,S)    any number that fits
    boolean         true/false, t/f, yes/no, y/n, 1/0 (any case)
    string          any scalar as its text; an object or array as its JSON
    date            ISO 8601 (2024-05-01, or a timestamp's date part) or days since 1970-01-01
    timestamp[tz]   ISO 8601 (with T or space, optional fraction and offset) or epoch milliseconds
    binary          base64
    time            ISO 8601 (10:11:12, optional fraction) or milliseconds since midnight
    struct          an object, field by field (missing fields NULL)
    list            an array, element by element
    map             an object, value by value
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_jobs.columns import all_of
from spark_jobs.plain_processors import FALSE_TEXTS, TRUE_TEXTS

INTEGER = "^-?[0-9]+$"
INT_MIN, INT_MAX = -(2**31), 2**31 - 1


@dataclass(frozen=True)
class Coerced:
    value: Column
    ok: Column


def shadow_type(target: T.DataType) -> T.DataType:
    """The type to parse JSON with when the table's types are known: the same nesting, every
    scalar as text, so that no value is lost to a type mismatch before conversion sees it."""
    if isinstance(target, T.StructType):
        return T.StructType([T.StructField(f.name, shadow_type(f.dataType), True) for f in target.fields])
    if isinstance(target, T.ArrayType):
        return T.ArrayType(shadow_type(target.elementType), True)
    if isinstance(target, T.MapType):
        return T.MapType(T.StringType(), shadow_type(target.valueType), True)
    return T.StringType()



def _null(target: T.DataType) -> Column:
    return F.lit(None).cast(target)


def exact_type(target: T.DataType) -> T.DataType | None:
    """The type that reads a column's decimals exactly from JSON (`coerce`'s `exact`): each as
    decimal(38, its scale), through structs (a list's or a map's are not); None where there is none."""
    if isinstance(target, T.DecimalType):
        return T.DecimalType(38, target.scale)
    if isinstance(target, T.StructType):
        fields = [T.StructField(f.name, found, True) for f in target.fields if (found := exact_type(f.dataType)) is not None]
        return T.StructType(fields) if fields else None
    return None


# A number as JSON spells it, or as Spark spells a double (1.0E18): text that Spark's two decimal
# readers (a cast, and JSON's parse as a decimal) read alike, by java.math.BigDecimal.
PLAIN_NUMBER = r"^[+-]?([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][+-]?[0-9]+)?$"


def coerce(source: Column, source_type: T.DataType, target: T.DataType, exact: Column | None = None) -> Coerced:
    """`source` (parsed as `source_type`) converted to `target`. `exact`: the same JSON value
    parsed as `exact_type(target)`, for its decimals. Parsed as text (or inferred as a double), a
    JSON number with a fraction or an exponent goes through a double: Jackson copies the token as
    Java's Double.toString spells it, 17 significant digits at most (1234567890123456789.12
    becomes 1.23456789012345677E18). The parse as a decimal reads the token's digits (rounded half
    up to the scale, as the text's conversion rounds). It reads a string too, but with its commas
    taken out ("1,5" is 15): its value is taken only where the text is a plain number, which both
    read alike, and where it read one (not beyond 38 digits): elsewhere the text's conversion decides."""
    present = source.isNotNull()
    if isinstance(target, T.StructType):
        if not isinstance(source_type, T.StructType):
            return Coerced(_null(target), ~present)
        fields = {f.name: f.dataType for f in source_type.fields}
        parts, oks = [], []
        for field in target.fields:
            if field.name in fields:
                inner = exact.getField(field.name) if exact is not None and exact_type(field.dataType) is not None else None
                converted = coerce(source.getField(field.name), fields[field.name], field.dataType, inner)
            else:
                converted = Coerced(_null(field.dataType), F.lit(True))
            parts.append(converted.value.alias(field.name))
            oks.append(converted.ok)
        return Coerced(F.when(present, F.struct(*parts)), ~present | all_of(oks))
    if isinstance(target, T.ArrayType):
        if not isinstance(source_type, T.ArrayType):
            return Coerced(_null(target), ~present)
        element = source_type.elementType

        def convert(x: Column) -> Column:
            return coerce(x, element, target.elementType).value

        def fits(x: Column) -> Column:
            return coerce(x, element, target.elementType).ok

        return Coerced(F.transform(source, convert), ~present | F.forall(source, fits))
    if isinstance(target, T.MapType):
        if isinstance(source_type, T.MapType):
            value_type = source_type.valueType
            return Coerced(
                key_ordered(F.transform_values(source, lambda _k, v: coerce(v, value_type, target.valueType).value)),
                ~present | F.forall(F.map_values(source), lambda v: coerce(v, value_type, target.valueType).ok),
            )
        if isinstance(source_type, T.StructType):  # JSON objects are inferred as structs
            converted = [(f.name, coerce(source.getField(f.name), f.dataType, target.valueType)) for f in source_type.fields]
            if not converted:
                return Coerced(F.when(present, F.create_map().cast(target)), F.lit(True))
            entries = F.create_map(*[item for name, c in converted for item in (F.lit(name), c.value)])
            return Coerced(
                F.when(present, key_ordered(F.map_filter(entries, lambda _k, v: v.isNotNull()))),
                ~present | all_of([c.ok for _n, c in converted]),
            )
        return Coerced(_null(target), ~present)
    if isinstance(source_type, (T.StructType, T.ArrayType, T.MapType)):
        if isinstance(target, T.StringType):
            return Coerced(F.to_json(source), F.lit(True))
        return Coerced(_null(target), ~present)
    text = source if isinstance(source_type, T.StringType) else source.cast("string")
    value = scalar(text, target)
    if exact is not None and isinstance(target, T.DecimalType):
        digits = exact.try_cast(target)
        value = F.when(text.rlike(PLAIN_NUMBER) & digits.isNotNull(), digits).otherwise(value)
    return Coerced(value, ~present | value.isNotNull())


def key_ordered(entries: Column) -> Column:
    """A map with its entries in key order (Spark compares strings by their UTF-8 bytes: code
    point order, as Python sorts them): a map read from JSON is written so, whatever order its
    object had and whichever way the batch took (the short way writes them so too)."""
    by_key = F.array_sort(F.map_entries(entries), lambda a, b: F.when(a["key"] < b["key"], -1).when(a["key"] > b["key"], 1).otherwise(0))
    return F.map_from_entries(by_key)


def scalar(text: Column, target: T.DataType) -> Column:
    """A scalar from its text, or NULL when the text is not a value of `target`."""
    trimmed = F.trim(text)
    if isinstance(target, T.StringType):
        return text
    if isinstance(target, T.BooleanType):
        word = F.lower(trimmed)
        return F.when(word.isin(*TRUE_TEXTS), F.lit(True)).when(word.isin(*FALSE_TEXTS), F.lit(False))
    if isinstance(target, (T.IntegerType, T.LongType, T.ShortType, T.ByteType)):
        as_double = trimmed.try_cast("double")
        whole = F.coalesce(
            trimmed.try_cast("bigint"),
            F.when((as_double == F.floor(as_double)) & (F.abs(as_double) < 9.2e18), as_double.cast("bigint")),
        )
        if isinstance(target, T.LongType):
            return whole
        return F.when(whole.between(INT_MIN, INT_MAX), whole.cast(target))
    if isinstance(target, (T.DoubleType, T.FloatType)):
        return trimmed.try_cast(target)
    if isinstance(target, T.DecimalType):
        return trimmed.try_cast(target)
    if isinstance(target, T.DateType):
        return F.when(trimmed.rlike(INTEGER), F.date_add(F.lit("1970-01-01").cast("date"), trimmed.try_cast("int"))).otherwise(
            trimmed.try_cast("date")
        )
    if isinstance(target, (T.TimestampType, T.TimestampNTZType)):
        millis = F.timestamp_millis(trimmed.try_cast("bigint"))
        return F.when(trimmed.rlike(INTEGER), millis.cast(target)).otherwise(trimmed.try_cast(target))
    if isinstance(target, T.BinaryType):
        return F.try_to_binary(trimmed, F.lit("base64"))
    if type(target).__name__ == "TimeType":  # pyspark 4.1+
        millis = trimmed.try_cast("bigint")
        from_millis = F.format_string(
            "%02d:%02d:%02d.%03d", F.floor(millis / 3_600_000), F.floor(millis / 60_000) % 60, F.floor(millis / 1000) % 60, millis % 1000
        )
        in_day = trimmed.rlike(INTEGER) & (millis >= 0) & (millis < 86_400_000)
        return F.when(in_day, from_millis.try_cast(target)).otherwise(trimmed.try_cast(target))
    raise ValueError(f"Calve cannot convert events to {target.simpleString()} columns")


def declared_not_null(column: Column, data_type: T.DataType) -> Column:
    """`column` as Spark sees a NOT NULL one, so the Parquet field is `required` as the table's is.

    Only for rows whose value is known to be there (the DLQ took the others): the fallback is never
    used, it only tells Spark the result cannot be NULL.
    """
    if isinstance(data_type, T.StructType):
        fallback = F.struct(*[_null(f.dataType).alias(f.name) for f in data_type.fields])
    elif isinstance(data_type, T.ArrayType):
        fallback = F.array().cast(data_type)
    elif isinstance(data_type, T.MapType):
        fallback = F.create_map().cast(data_type)
    elif isinstance(data_type, (T.StringType, T.BinaryType)):
        fallback = F.lit("").cast(data_type)
    elif isinstance(data_type, T.BooleanType):
        fallback = F.lit(False)
    elif isinstance(data_type, (T.DateType, T.TimestampType, T.TimestampNTZType)):
        fallback = F.lit(0).cast("timestamp").cast(data_type)
    elif type(data_type).__name__ == "TimeType":
        fallback = F.lit("00:00:00").cast(data_type)
    else:
        fallback = F.lit(0).cast(data_type)
    return F.coalesce(column, fallback)
