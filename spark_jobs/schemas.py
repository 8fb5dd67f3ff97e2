"""A table's schema from a batch's rows: inferred for a new table, and the widenings an evolving
table needs (JSON numbers say only "number")."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

from spark_jobs.columns import INTERNAL, by_name, column_name_ok


def without_null_types(schema: T.StructType) -> T.StructType:
    """Drop fields whose type is unknown (JSON null everywhere in the batch), at any depth."""
    def keep(data_type: T.DataType) -> T.DataType | None:
        if isinstance(data_type, T.NullType):
            return None
        if isinstance(data_type, T.StructType):
            fields = [T.StructField(f.name, t, True) for f in data_type.fields if (t := keep(f.dataType)) is not None]
            return T.StructType(fields) if fields else None
        if isinstance(data_type, T.ArrayType):
            element = keep(data_type.elementType)
            return T.ArrayType(element, True) if element is not None else None
        return data_type

    return T.StructType([T.StructField(f.name, t, True) for f in schema.fields if (t := keep(f.dataType)) is not None])


def inferred_table_schema(rows: DataFrame) -> pa.Schema | None:
    """A new table's schema from the rows bound for it: the fields that have a value in at least
    one of them (None when there are no rows). One Spark action."""
    columns = [c for c in rows.columns if not c.startswith(INTERNAL) and column_name_ok(c)]
    counts = rows.select(F.count(F.lit(1)).alias("_calve_rows"), *[F.count(by_name(c)).alias(c) for c in columns]).first()
    if not counts or not counts["_calve_rows"]:
        return None
    present = [f for f in rows.schema.fields if f.name in columns and counts[f.name]]
    schema = without_null_types(T.StructType(present))
    return to_arrow_schema(schema) if schema.fields else pa.schema([])


NARROW_LIMITS = {pa.int32(): 2**31 - 1, pa.float32(): 3.4e38}


def needed_widenings(current: pa.Schema, incoming: pa.Schema, rows: DataFrame) -> pa.Schema:
    """`incoming` with int/float kept narrow where the table has them and the values still fit.

    JSON says only "number", so inference reports long and double for every number; a table's int
    column is widened to long only when a value needs it (one Spark action, and only when such a
    column is there).
    """
    narrow = {f.name: f.type for f in current if f.type in NARROW_LIMITS}
    candidates = [f.name for f in incoming if f.name in narrow and f.type != narrow[f.name]]
    if not candidates:
        return incoming
    peaks = rows.select(*[F.max(F.abs(by_name(name))).alias(name) for name in candidates]).first()
    kept = []
    for column in incoming:
        if column.name in candidates and (peaks[column.name] is None or peaks[column.name] <= NARROW_LIMITS[narrow[column.name]]):
            column = column.with_type(narrow[column.name])
        kept.append(column)
    return pa.schema(kept)


def field_count(fields: pa.Schema | pa.StructType | list[pa.Field]) -> int:
    """How many fields `fields` hold at any depth, as Iceberg gives each an id: every field, and
    inside it a struct's fields, a list's element, a map's key and value."""
    return sum(1 + _nested_count(f.type) for f in fields)


def _nested_count(data_type: pa.DataType) -> int:
    if pa.types.is_struct(data_type):
        return field_count(list(data_type))
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type) or pa.types.is_fixed_size_list(data_type):
        return 1 + _nested_count(data_type.value_type)
    if pa.types.is_map(data_type):
        return 2 + _nested_count(data_type.key_type) + _nested_count(data_type.item_type)
    return 0


def within_limit(fields: list[pa.Field], budget: int, prefix: str = "") -> tuple[list[pa.Field], list[str]]:
    """The first of `fields` that fit in `budget` field ids (field_count), in order: a struct that
    does not fit whole keeps the fields of it that fit. Also the dotted names of those left out."""
    kept, left_out = [], []
    for field in fields:
        cost = field_count([field])
        if cost <= budget:
            kept.append(field)
            budget -= cost
        elif pa.types.is_struct(field.type) and budget >= 2:
            inner, inner_out = within_limit(list(field.type), budget - 1, f"{prefix}{field.name}.")
            if inner:
                kept.append(field.with_type(pa.struct(inner)))
                budget -= field_count(kept[-1:])
            left_out += inner_out
        else:
            left_out.append(prefix + field.name)
    return kept, left_out


def narrowed(schema: T.StructType, wanted: set[str], limit: int) -> T.StructType | None:
    """None when a batch's fields fit in `limit` (field_count, any depth); else the top-level
    fields in `wanted` and, in order, the others that fit (within_limit: a struct keeps the fields
    of it that fit). A batch of wide events is parsed with these only: a Spark plan's cost grows
    with its columns, and no table takes more than the limit (the others are read from the events'
    text where a table has them as columns: convert.py)."""
    arrow = to_arrow_schema(schema)
    if field_count(arrow) <= limit:
        return None
    first = [f for f in arrow if f.name in wanted]
    kept, _left_out = within_limit([f for f in arrow if f.name not in wanted], limit - field_count(first))
    chosen = {f.name: f for f in first + kept}
    return from_arrow_schema(pa.schema([chosen[f.name] for f in arrow if f.name in chosen]))
