"""The batch's events as rows: split from the request bodies, the api's set-aside events taken
out, parsed with the table's types or with types inferred from the batch."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_jobs.columns import BODY, EVENT, INTERNAL, LINE_SLOTS, REASON, RECEIPT, SEQ
from spark_jobs.contract import SET_ASIDE_MARK
from spark_jobs.otlp_rows import is_rows


def event_rows(spark: SparkSession, receipts: list[str], bodies: list[bytes]) -> DataFrame:
    """One row per event: its request's receipt, its original JSON text and its place in the batch."""
    arrow = pa.table({
        RECEIPT: pa.array(receipts, type=pa.string()),
        BODY: pa.array(bodies, type=pa.large_binary()).cast(pa.large_string()),
        SEQ: pa.array([index * LINE_SLOTS for index in range(len(bodies))], type=pa.int64()),
    })
    frame = spark.createDataFrame(arrow)
    lines = frame.select(RECEIPT, SEQ, F.posexplode(F.split(F.col(BODY), "\n")).alias("_calve_line", EVENT))
    return lines.select(RECEIPT, EVENT, (F.col(SEQ) + F.col("_calve_line")).alias(SEQ)).where(F.length(EVENT) > 0)


def has_set_aside(body: bytes) -> bool:
    """Whether the api set aside events of this body (never of an export's columns, whose binary
    may hold the mark's bytes: otlp_rows.py)."""
    return not is_rows(body) and (body.startswith(SET_ASIDE_MARK.encode()) or b"\n" + SET_ASIDE_MARK.encode() in body)


def set_aside_rows(events: DataFrame) -> DataFrame:
    """The events the api set aside: their original text as EVENT, and the api's REASON."""
    wrapped = F.substring(EVENT, 2, 2**31 - 1)
    return events.where(F.startswith(EVENT, F.lit(SET_ASIDE_MARK))).select(
        RECEIPT, F.get_json_object(wrapped, "$.event").alias(EVENT), F.get_json_object(wrapped, "$.reason").alias(REASON)
    )


def infer_event_schema(spark: SparkSession, events: DataFrame) -> T.StructType:
    """The fields of this batch's events as Spark's JSON reader infers them (integers are long,
    other numbers double, ISO timestamps stay strings until a table's schema says otherwise)."""
    inferred = once_each(spark.read.json(events.select(EVENT)).schema)
    return T.StructType([f for f in inferred.fields if not f.name.startswith(INTERNAL) and f.name != "_corrupt_record"])


def once_each(data_type: T.DataType) -> T.DataType:
    """`data_type` with each struct's fields named once: Spark's reader infers a field twice where
    an event holds its key twice (`{"a": 1, "a": 2}`), and every reference to it is then
    ambiguous (AMBIGUOUS_REFERENCE_TO_FIELDS: the batch failed, halved down to the request, which
    went to the DLQ). The two are merged as its inference merges two events' types (_merged)."""
    if isinstance(data_type, T.ArrayType):
        return T.ArrayType(once_each(data_type.elementType), data_type.containsNull)
    if not isinstance(data_type, T.StructType):
        return data_type
    fields: dict[str, T.StructField] = {}
    for f in data_type.fields:
        kept = fields.get(f.name)
        fields[f.name] = T.StructField(f.name, once_each(f.dataType) if kept is None else _merged(kept.dataType, once_each(f.dataType)), True)
    return T.StructType(list(fields.values()))


def _merged(one: T.DataType, other: T.DataType) -> T.DataType:
    """The type that holds values of both, as Spark's JSON inference widens one event's type by
    another's: structs field by field, lists by their elements, numbers to double, any other
    two types to text."""
    if one == other:
        return one
    if isinstance(one, T.StructType) and isinstance(other, T.StructType):
        return once_each(T.StructType([*one.fields, *other.fields]))
    if isinstance(one, T.ArrayType) and isinstance(other, T.ArrayType):
        return T.ArrayType(_merged(one.elementType, other.elementType), True)
    if isinstance(one, T.NullType):
        return other
    if isinstance(other, T.NullType):
        return one
    if isinstance(one, (T.LongType, T.DoubleType, T.DecimalType)) and isinstance(other, (T.LongType, T.DoubleType, T.DecimalType)):
        return T.DoubleType()
    return T.StringType()


def parse(events: DataFrame, schema: T.StructType) -> DataFrame:
    parsed = events.select(RECEIPT, EVENT, SEQ, F.from_json(EVENT, schema).alias("_calve_e"))
    return parsed.select(RECEIPT, EVENT, SEQ, *[F.col("_calve_e").getField(f.name).alias(f.name) for f in schema.fields])
