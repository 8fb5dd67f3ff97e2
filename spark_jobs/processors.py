"""A definition's processors, routes and table names over the parsed events, and the operation
of a sink that changes rows. Expressions were checked when the pipeline was stored."""

from __future__ import annotations

from collections.abc import Iterator

import sqlglot
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from sqlglot import exp

from spark_jobs.columns import INTERNAL, OP, OP_VALUE
from spark_jobs.definition import Processor, Sink

# Row changes: what an event's operation says, case-insensitively (anything else goes to the DLQ).
OPERATIONS = {
    "insert": "I", "i": "I", "c": "I", "create": "I", "r": "I", "index": "I",
    "update": "U", "u": "U",
    "delete": "D", "d": "D",
}


def referenced_paths(expression: str) -> set[tuple[str, ...]]:
    """The fields an expression reads, as paths (`http.status` -> ("http", "status"))."""
    tree = sqlglot.parse_one(expression, read="spark")
    return {tuple(part.name for part in column.parts) for column in tree.find_all(exp.Column) if column.parts}


def with_path(frame: DataFrame, path: tuple[str, ...]) -> DataFrame:
    """The frame with field `path` present (NULL where it was missing), so that an expression over
    a field no event of this batch has reads NULL instead of failing the whole job."""
    root, rest = path[0], path[1:]

    def nulls(names: tuple[str, ...]) -> Column:
        value = F.lit(None).cast("string")
        for name in reversed(names):
            value = F.struct(value.alias(name))
        return value

    if root not in frame.columns:
        # A top-level field no event has: NULL of no type, which NOT, AND and OR take as well as
        # comparisons do (a string NULL failed `NOT flag` for a batch without `flag`).
        return frame.withColumn(root, F.lit(None) if not rest else nulls(rest))
    data_type = frame.schema[root].dataType
    for depth, name in enumerate(rest):
        if not isinstance(data_type, T.StructType):
            return frame  # a map, array or scalar: Spark's own rules apply
        if name not in data_type.fieldNames():
            return frame.withColumn(root, F.col(root).withField(".".join(rest[: depth + 1]), nulls(rest[depth + 1:])))
        data_type = data_type[name].dataType
    return frame


# The types a field that no event of a batch has is tried as, in turn, until the definition's
# expressions resolve: of no type (NOT, AND, OR take it), then each that an expression may need.
NULL_TYPES = (None, "boolean", "string", "bigint", "double")


def untyped_nulls(frame: DataFrame, names: set[str]) -> Iterator[DataFrame]:
    """The frame with those of the top-level fields `names` that it lacks, or holds as strings NULL
    in every row (what Spark's JSON inference makes of a field JSON null in every event), as NULL
    of each of NULL_TYPES in turn; nothing when there are none. One Spark action, over those
    string fields only."""
    missing = sorted(name for name in names if name not in frame.columns)
    strings = sorted(name for name in names if name in frame.columns and isinstance(frame.schema[name].dataType, T.StringType))
    if strings:
        counts = frame.select(*[F.count(F.col(name)).alias(name) for name in strings]).first()
        missing += [name for name in strings if counts is not None and counts[name] == 0]
    if not missing:
        return
    for data_type in NULL_TYPES:
        null = F.lit(None) if data_type is None else F.lit(None).cast(data_type)
        yield frame.withColumns({name: null for name in missing})


def with_fields(frame: DataFrame, expressions: list[str]) -> DataFrame:
    for path in sorted(set().union(*(referenced_paths(e) for e in expressions))) if expressions else []:
        frame = with_path(frame, path)
    return frame


def apply_processors(frame: DataFrame, processors: list[Processor]) -> DataFrame:
    for processor in processors:
        if processor.where is not None:
            frame = with_fields(frame, [processor.where]).where(F.coalesce(F.expr(processor.where).cast("boolean"), F.lit(False)))
        elif processor.set is not None:
            frame = with_fields(frame, list(processor.set.values()))
            frame = frame.withColumns({name: F.expr(expression) for name, expression in processor.set.items()})
        elif processor.drop is not None:
            frame = frame.drop(*processor.drop)
        elif processor.rename is not None:
            frame = frame.withColumnsRenamed({old: new for old, new in processor.rename.items() if old in frame.columns})
    return frame


def route_column(name: str) -> str:
    return f"{INTERNAL}route_{name}"


def apply_routes(frame: DataFrame, routes: dict[str, str]) -> DataFrame:
    if not routes:
        return frame
    frame = with_fields(frame, list(routes.values()))
    return frame.withColumns({route_column(n): F.coalesce(F.expr(e).cast("boolean"), F.lit(False)) for n, e in routes.items()})


def table_name_column(template: str, dynamic_fields: list[str]) -> Column:
    """`${service}_events` -> concat(lower(service), '_events'); NULL when the event lacks a field."""
    if not dynamic_fields:
        return F.lit(template)
    parts: list[Column] = []
    rest = template
    for name in dynamic_fields:
        before, _, rest = rest.partition("${" + name + "}")
        if before:
            parts.append(F.lit(before))
        parts.append(F.lower(F.col(name).cast("string")))  # concat is NULL when a field is missing
    if rest:
        parts.append(F.lit(rest))
    return F.concat(*parts)


def operation_fields(sink: Sink) -> list[str]:
    """The top-level fields a sink's operation reads, other than its identifier columns: they say
    what to do with a row, and are no columns of the table unless its schema declares them."""
    operation = sink.operation
    keys = set(sink.identifier_columns or ())
    return sorted({path[0] for path in referenced_paths(operation)} - keys) if operation else []


def with_operation(rows: DataFrame, operation: str | None) -> DataFrame:
    """The rows with OP (I, U or D; NULL for a value that names no operation) and OP_VALUE (the
    expression's own value, for the DLQ reason). No operation expression: every event inserts."""
    if operation is None:
        return rows.withColumns({OP: F.lit("I"), OP_VALUE: F.lit("insert")})
    rows = with_fields(rows, [operation])
    value = F.expr(operation).cast("string")
    mapping = F.create_map(*[F.lit(part) for pair in OPERATIONS.items() for part in pair])
    return rows.withColumn(OP_VALUE, value).withColumn(OP, mapping[F.lower(F.trim(F.col(OP_VALUE)))])
