"""Rows bound for a table in the table's types (coerce.py converts each column), with the reason
for those that must go to the DLQ instead, and the event's fields no column takes: kept in the
sink's extra_fields map, or named as dropped."""

from __future__ import annotations

from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema

from spark_jobs.coerce import coerce
from spark_jobs.columns import DROPPED, EVENT, INTERNAL, OP, OP_VALUE, REASON, RECEIPT, SEQ, TABLE
from spark_jobs.targets import Target

NO_NAMES = "array<string>"


def convert(rows: DataFrame, target: Target, consumed: list[str], parsed_with_table_schema: bool) -> DataFrame:
    """Rows in the table's types, with a REASON for those that must go to the DLQ instead, and
    the fields no column takes (DROPPED). `consumed`: fields the sink's operation reads (no
    column's); `parsed_with_table_schema`: the events' other fields were never parsed."""
    source_types = {f.name: f.dataType for f in rows.schema.fields}
    target_fields = from_arrow_schema(target.schema).fields
    keys = set(target.changes.keys) if target.changes is not None else set()
    # A delete needs only the row's key: the table's other required fields may be absent.
    not_delete = F.col(OP) != F.lit("D") if keys else F.lit(True)
    columns, reasons, present = [], [], []
    for column in target_fields:
        if column.name == target.extra_fields:
            kept = extra_fields(rows, target, consumed, parsed_with_table_schema)
            columns.append(kept.alias(column.name))
            present.append(kept.isNotNull())
            continue
        if column.name in source_types:
            converted = coerce(F.col(column.name), source_types[column.name], column.dataType)
            present.append(F.col(column.name).isNotNull())
        else:
            converted = coerce(F.lit(None), T.NullType(), column.dataType)
        columns.append(converted.value.alias(column.name))
        missing = F.col(column.name).isNull() if column.name in source_types else F.lit(True)
        unconvertible = F.lit(f"field {column.name!r} cannot be converted to {column.dataType.simpleString()}")
        if column.name in keys:
            reasons.append(F.when(missing, F.lit(f"missing identifier field {column.name!r}")))
            reasons.append(F.when(~converted.ok, unconvertible))
        elif column.name in target.required:
            reasons.append(F.when(not_delete & missing, F.lit(f"missing required field {column.name!r}")))
            reasons.append(F.when(not_delete & ~converted.ok, unconvertible))
    matches_nothing = ~reduce(lambda a, b: a | b, present) if present else F.lit(True)
    reasons.insert(0, F.when(matches_nothing, F.lit(f"no field of the event matches a column of table {target.name!r}")))
    extra = [SEQ]
    if keys:
        reasons.insert(0, F.when(F.col(OP).isNull(), F.concat(
            F.lit("operation "), F.coalesce(F.concat(F.lit("'"), F.col(OP_VALUE), F.lit("'")), F.lit("null")),
            F.lit(" is not insert, update or delete"),
        )))
        extra.append(OP)
    dropped = F.array().cast(NO_NAMES) if target.extra_fields else dropped_fields(rows, target, consumed, parsed_with_table_schema)
    return rows.select(RECEIPT, EVENT, TABLE, *extra, *columns, F.coalesce(*reasons).alias(REASON), dropped.alias(DROPPED))


def dropped_fields(rows: DataFrame, target: Target, consumed: list[str], parsed_with_table_schema: bool) -> Column:
    """The names of the event's top-level fields that no column of the table takes (and no
    operation reads): what writing the row loses, said in the receipt instead of silently."""
    taken = [*target.schema.names, *consumed]
    if parsed_with_table_schema:
        # Parsed with the table's own fields, the others were never read: look at the keys.
        return F.array_except(F.coalesce(F.json_object_keys(EVENT), F.array().cast(NO_NAMES)), F.array(*[F.lit(n) for n in taken]).cast(NO_NAMES))
    extra = [c for c in rows.columns if not c.startswith(INTERNAL) and c not in taken]
    if not extra:
        return F.array().cast(NO_NAMES)
    return F.filter(F.array(*[F.when(F.col(c).isNotNull(), F.lit(c)) for c in extra]), lambda name: name.isNotNull())


def extra_fields(rows: DataFrame, target: Target, consumed: list[str], parsed_with_table_schema: bool) -> Column:
    """The event's top-level fields that no other column of the table takes (and no operation
    reads), non-null ones, as a map of their JSON text (strings as they are); NULL when none."""
    taken = {*[n for n in target.schema.names if n != target.extra_fields], *consumed}
    if parsed_with_table_schema:
        # Parsed with the table's own fields, the others were never read: parse them as text,
        # only for the events that have any (listing the keys costs less than the map).
        names = F.array(*[F.lit(n) for n in taken]).cast(NO_NAMES)
        others = F.array_except(F.coalesce(F.json_object_keys(EVENT), F.array().cast(NO_NAMES)), names)
        fields = F.from_json(F.col(EVENT), T.MapType(T.StringType(), T.StringType()))
        kept = F.when(F.size(others) > 0, F.map_filter(fields, lambda k, v: v.isNotNull() & ~F.array_contains(names, k)))
    else:
        types = {f.name: f.dataType for f in rows.schema.fields if not f.name.startswith(INTERNAL) and f.name not in taken}
        if not types:
            return F.lit(None).cast("map<string,string>")
        entries = F.array(*[F.struct(F.lit(name).alias("key"), as_text(F.col(name), data_type).alias("value")) for name, data_type in types.items()])
        kept = F.map_from_entries(F.filter(entries, lambda entry: entry["value"].isNotNull()))
    return F.when(F.size(kept) > 0, kept)


def as_text(column: Column, data_type: T.DataType) -> Column:
    """A field's value as an extra_fields map keeps it: strings as they are, others as JSON."""
    if isinstance(data_type, T.StringType):
        return column
    if isinstance(data_type, (T.StructType, T.ArrayType, T.MapType)):
        return F.to_json(column)
    return column.cast("string")
