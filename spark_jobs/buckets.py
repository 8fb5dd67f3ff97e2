"""Iceberg's bucket transform, computed in Spark's Python workers, for the short way's tasks
(direct_append.py) and the Spark job's files alike (partitions.py: `with_buckets`).

Iceberg: bucket(v) = (murmur3_x86_32(bytes(v), seed 0) & Integer.MAX_VALUE) % N, where the bytes
are the value as an 8-byte little-endian long for int, long, date (days) and timestamps
(microseconds), and the UTF-8 bytes for strings. Spark's own `hash()` is Murmur3 with seed 42 and
its own byte layout, so it cannot be used. Built from Spark's bigint expressions instead (this
module's way until it was measured: a string's bytes folded one by one), the Spark job wrote a
table partitioned by bucket[8] of a string at 4,700 events/s, its JVM spending 57 CPU-s per
100,000 events; computed here, 42,000 events/s and 3.4 CPU-s (`make bench`'s `orders` shape with
a processor the short way leaves to the Spark job). Each distinct value is hashed once, by mmh3
(pyiceberg's own hash, in C), or by `murmur3_32` in a worker without it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pyarrow as pa
from pyspark import cloudpickle
from pyspark.sql import DataFrame
from pyspark.sql import types as T

from spark_jobs.task_code import bound

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # run in Spark's workers, which need nothing of Calve


def buckets(column: pa.Array | pa.ChunkedArray, count: int) -> pa.Array | pa.ChunkedArray:
    """Iceberg's bucket[count] of each value (NULL for NULL) of a column of integers, strings,
    binary, dates or timestamps (microseconds)."""
    import struct

    import pyarrow.compute as pc

    try:
        from mmh3 import hash as murmur3  # in C
    except ImportError:
        murmur3 = murmur3_32
    if pa.types.is_timestamp(column.type) or pa.types.is_date(column.type):
        column = column.cast(pa.int64() if pa.types.is_timestamp(column.type) else pa.int32())
    values = pc.unique(column)
    if pa.types.is_integer(values.type):
        data = [None if v is None else struct.pack("<q", v) for v in values.to_pylist()]
    elif pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type):
        data = values.to_pylist()
    else:
        data = [None if v is None else v.encode() for v in values.to_pylist()]
    hashed = pa.array([None if d is None else (murmur3(d) & 0x7FFFFFFF) % count for d in data], pa.int32())
    return pc.take(hashed, pc.index_in(column, value_set=values))


def murmur3_32(data: bytes) -> int:
    """MurmurHash3 x86 32-bit of `data`, seed 0 (unsigned), as mmh3.hash computes it in C."""
    mask, c1, c2 = 0xFFFFFFFF, 0xCC9E2D51, 0x1B873593

    def mixed(k: int) -> int:
        k = (k * c1) & mask
        return (((k << 15) | (k >> 17)) * c2) & mask

    h, whole = 0, len(data) - len(data) % 4
    for at in range(0, whole, 4):
        h ^= mixed(int.from_bytes(data[at:at + 4], "little"))
        h = ((((h << 13) | (h >> 19)) & mask) * 5 + 0xE6546B64) & mask
    if whole < len(data):
        h ^= mixed(int.from_bytes(data[whole:], "little"))
    h ^= len(data)
    h = ((h ^ (h >> 16)) * 0x85EBCA6B) & mask
    h = ((h ^ (h >> 13)) * 0xC2B2AE35) & mask
    return h ^ (h >> 16)


BUCKETED_TYPES = (T.IntegerType, T.LongType, T.ShortType, T.ByteType, T.DateType, T.TimestampType, T.TimestampNTZType, T.StringType, T.BinaryType)


def with_buckets(frame: DataFrame, columns: list[tuple[str, str, int]]) -> DataFrame:
    """`frame` with a column `name` of Iceberg's bucket[count] of column `source` for each (name,
    source, count), computed in Spark's Python workers (`mapInArrow`)."""
    types = {f.name: f.dataType for f in frame.schema.fields}
    for _name, source, _count in columns:
        if not isinstance(types[source], BUCKETED_TYPES):
            raise ValueError(f"bucket partitions of {types[source].simpleString()} columns are not supported")
    schema = T.StructType([*frame.schema.fields, *(T.StructField(name, T.IntegerType()) for name, _source, _count in columns)])
    return frame.mapInArrow(bound(_with_buckets, list(columns)), schema)


def _with_buckets(columns: list[tuple[str, str, int]], batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        arrays = [*batch.columns, *(buckets(batch.column(source), count) for _name, source, count in columns)]
        yield pa.RecordBatch.from_arrays(arrays, names=[*batch.schema.names, *(name for name, _source, _count in columns)])
