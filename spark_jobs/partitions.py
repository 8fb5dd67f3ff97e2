"""Rows into data files: one file per partition value (the Iceberg transform computed in Spark),
and files near a target size."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema

from spark_jobs.buckets import with_buckets
from spark_jobs.coerce import declared_not_null
from spark_jobs.columns import INTERNAL, by_name
from spark_jobs.files import write_parquet
from spark_jobs.targets import Target


def partition_value(column: Column, transform: str) -> Column:
    """The Iceberg partition value of `transform` (UTC), to group a file's rows by."""
    if transform == "identity":
        return column
    if transform == "year":
        return F.year(column) - 1970
    if transform == "month":
        return (F.year(column) - 1970) * 12 + F.month(column) - 1
    if transform == "day":
        return F.datediff(F.to_date(column), F.lit("1970-01-01").cast("date"))
    if transform == "hour":
        return F.floor(F.unix_micros(column.cast("timestamp")) / 3_600_000_000)
    raise ValueError(f"unsupported transform {transform}")


def truncate(column: Column, width: int, data_type: T.DataType) -> Column:
    if isinstance(data_type, (T.StringType, T.BinaryType)):
        return F.substring(column, 1, width)
    # Integers: v - (((v % W) + W) % W), as Iceberg defines it for negatives too.
    return column - (((column % width) + width) % width)


def write_data_files(good: DataFrame, target: Target, rows: int = 0, per_file: int | None = None) -> None:
    """The table's data files of `good` (in the table's types) under target.directory: one file
    per partition value for a partitioned table, `per_file` rows per file at most when given."""
    data = good.select(*[
        declared_not_null(by_name(f.name), from_arrow_schema(pa.schema([f]))[0].dataType).alias(f.name)
        if f.name in target.required else by_name(f.name)
        for f in target.schema
    ])
    if per_file and not target.partition:
        data = data.repartition(max(1, -(-rows // per_file)))
    if not target.partition:
        write_parquet(data, target.directory, target.filesystem, schema=target.schema, max_records=per_file)
        return
    types = {f.name: f.dataType for f in from_arrow_schema(target.schema).fields}
    keys, bucketed = [], []
    for index, (source, transform) in enumerate(target.partition):
        name = f"{INTERNAL}p{index}"
        keys.append(name)
        if transform.startswith("bucket["):
            bucketed.append((name, source, int(transform[len("bucket["):-1])))
            continue
        if transform.startswith("truncate["):
            value = truncate(by_name(source), int(transform[len("truncate["):-1]), types[source])
        else:
            value = partition_value(by_name(source), transform)
        data = data.withColumn(name, value)
    if bucketed:
        data = with_buckets(data, bucketed)
    # One task per partition value, so each value is one file; the source column stays in it.
    write_parquet(data.repartition(*keys), target.directory, target.filesystem, schema=target.schema, max_records=per_file, partition_by=keys)
