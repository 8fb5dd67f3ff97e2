"""Iceberg's bucket transform as Spark column expressions, so a job can write one bucket per file.

Iceberg: bucket(v) = (murmur3_x86_32(bytes(v), seed 0) & Integer.MAX_VALUE) % N, where the bytes
are the value as an 8-byte little-endian long for int, long, date (days) and timestamps
(microseconds), and the UTF-8 bytes for strings. Spark's own `hash()` is Murmur3 with seed 42 and
its own byte layout, so it cannot be used; this builds the same arithmetic from 32-bit steps held
in bigint columns (Spark's non-ANSI bigint multiplication wraps, and the low 32 bits stay right).
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

MASK = 0xFFFFFFFF
C1, C2 = 0xCC9E2D51, 0x1B873593


def _u32(value: Column) -> Column:
    return value.bitwiseAND(F.lit(MASK))


def _rotl(value: Column, bits: int) -> Column:
    return _u32(F.shiftleft(value, bits).bitwiseOR(F.shiftrightunsigned(value, 32 - bits)))


def _mix_k(k: Column) -> Column:
    return _u32(_rotl(_u32(k * F.lit(C1)), 15) * F.lit(C2))


def _mix_h(h: Column, k: Column) -> Column:
    return _u32(_rotl(h.bitwiseXOR(_mix_k(k)), 13) * F.lit(5) + F.lit(0xE6546B64))


def _finish(h: Column, length: Column) -> Column:
    h = h.bitwiseXOR(length)
    h = h.bitwiseXOR(F.shiftrightunsigned(h, 16))
    h = _u32(h * F.lit(0x85EBCA6B))
    h = h.bitwiseXOR(F.shiftrightunsigned(h, 13))
    h = _u32(h * F.lit(0xC2B2AE35))
    return h.bitwiseXOR(F.shiftrightunsigned(h, 16))


def _hash_long(value: Column) -> Column:
    low = _u32(value)
    high = _u32(F.shiftrightunsigned(value, 32))
    return _finish(_mix_h(_mix_h(F.lit(0).cast("bigint"), low), high), F.lit(8))


def _byte(data: Column, position: Column) -> Column:
    """The unsigned byte at 0-based `position` of a binary column."""
    return F.conv(F.hex(F.substring(data, position + 1, 1)), 16, 10).cast("bigint")


def _hash_bytes(data: Column) -> Column:
    length = F.length(data).cast("bigint")
    blocks = F.floor(length / 4).cast("int")

    def block(h: Column, index: Column) -> Column:
        base = index * 4
        k = _byte(data, base) + F.shiftleft(_byte(data, base + 1), 8) + F.shiftleft(_byte(data, base + 2), 16) + F.shiftleft(_byte(data, base + 3), 24)
        return _mix_h(h, k)

    body = F.aggregate(F.sequence(F.lit(0), blocks - 1), F.lit(0).cast("bigint"), block)
    body = F.when(blocks > 0, body).otherwise(F.lit(0).cast("bigint"))
    tail_start = blocks * 4
    tail_length = length - tail_start
    tail = (
        F.when(tail_length >= 1, _byte(data, tail_start)).otherwise(0)
        + F.when(tail_length >= 2, F.shiftleft(_byte(data, tail_start + 1), 8)).otherwise(0)
        + F.when(tail_length >= 3, F.shiftleft(_byte(data, tail_start + 2), 16)).otherwise(0)
    )
    with_tail = F.when(tail_length > 0, body.bitwiseXOR(_mix_k(tail))).otherwise(body)
    return _finish(with_tail, length)


def bucket(column: Column, data_type: T.DataType, buckets: int) -> Column:
    """Iceberg's bucket[buckets] of `column` (NULL stays NULL)."""
    if isinstance(data_type, (T.IntegerType, T.LongType, T.ShortType, T.ByteType)):
        hashed = _hash_long(column.cast("bigint"))
    elif isinstance(data_type, T.DateType):
        hashed = _hash_long(F.datediff(column, F.lit("1970-01-01").cast("date")).cast("bigint"))
    elif isinstance(data_type, (T.TimestampType, T.TimestampNTZType)):
        hashed = _hash_long(F.unix_micros(column.cast("timestamp")))
    elif isinstance(data_type, T.StringType):
        hashed = _hash_bytes(F.encode(column, "UTF-8"))
    elif isinstance(data_type, T.BinaryType):
        hashed = _hash_bytes(column)
    else:
        raise ValueError(f"bucket partitions of {data_type.simpleString()} columns are not supported")
    return F.when(column.isNotNull(), hashed.bitwiseAND(F.lit(0x7FFFFFFF)) % F.lit(buckets))
