"""The writer's Spark job: request bodies (NDJSON) in, Parquet data files out.

Each buffered request is one row holding its whole NDJSON body; Spark splits the bodies into
events, parses them against the table's schema and writes zstd Parquet into a fresh directory.
Sending bodies rather than events keeps the Arrow batch shipped over Spark Connect small in rows
and leaves the per-event work to the cluster.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructType

BODY_COLUMN = "body"
EVENT_COLUMN = "value"


def events_frame(spark: SparkSession, bodies: list[bytes]) -> DataFrame:
    """One string row per event, from NDJSON request bodies."""
    arrow = pa.table({BODY_COLUMN: pa.array(bodies, type=pa.large_binary()).cast(pa.large_string())})
    frame = spark.createDataFrame(arrow)
    return frame.select(F.explode(F.split(F.col(BODY_COLUMN), "\n")).alias(EVENT_COLUMN)).where(
        F.length(EVENT_COLUMN) > 0
    )


def infer_schema(spark: SparkSession, bodies: list[bytes]) -> pa.Schema:
    """The schema Spark's JSON reader infers from these events, as an Arrow schema.

    Inference sees JSON types only: integers become long, other numbers double, and strings stay
    strings (a timestamp written as a string is a string until a pipeline says otherwise).
    """
    inferred = spark.read.json(events_frame(spark, bodies)).schema
    return to_arrow_schema(inferred)


def spark_schema(schema: pa.Schema) -> StructType:
    """The Spark schema to parse events with, from the table's Arrow schema."""
    return from_arrow_schema(schema)


def write_events(
    spark: SparkSession, bodies: list[bytes], schema: pa.Schema, directory: str
) -> None:
    """Parse the events against `schema` and write them as Parquet files under `directory`.

    A field whose value does not fit its column's type is written as NULL (Spark's permissive
    JSON mode); fields the schema does not know are not written.
    """
    parsed = spark.read.json(events_frame(spark, bodies), schema=spark_schema(schema), mode="PERMISSIVE")
    # One file per Spark task: parsing runs on every core the cluster gives the job; a batch is
    # sized so that each task's file is a reasonable size.
    parsed.write.mode("error").option("compression", "zstd").parquet(directory)
