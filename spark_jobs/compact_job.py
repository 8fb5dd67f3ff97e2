"""The Spark side of compaction: the rows of many small Parquet files of one partition, written
again as a few files near the target size. Rows are copied as they are (read with the table's
current schema, so a column added since reads as null): nothing is added, dropped or changed,
which the committer checks by row count before it commits the result as a `replace` snapshot."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from spark_jobs.coerce import declared_not_null
from spark_jobs.files import read_parquet, write_parquet


def rewrite_files(
    spark: SparkSession, paths: list[str], schema: pa.Schema, required: frozenset[str], directory: str, outputs: int,
    filesystem: object | None = None,
) -> None:
    """Write the rows of `paths` into `outputs` Parquet files under `directory` (filesystem: as
    for spark_jobs.files)."""
    spark_schema = from_arrow_schema(schema)
    frame = read_parquet(spark, paths, schema, filesystem)
    frame = frame.select(*[
        declared_not_null(F.col(field.name), field.dataType).alias(field.name) if field.name in required else F.col(field.name)
        for field in spark_schema.fields
    ])
    # coalesce, not repartition: each output task reads whole input files, without a shuffle.
    write_parquet(frame.coalesce(max(1, outputs)), directory, filesystem, schema=schema)
