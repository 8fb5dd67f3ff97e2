"""Iceberg's bucket transform computed in Spark's Python workers matches pyiceberg's, value for value."""

from __future__ import annotations

from datetime import date, datetime, timezone

import pyarrow as pa
import pytest
from pyiceberg.transforms import BucketTransform
from pyiceberg.types import (
    BinaryType,
    DateType,
    IntegerType,
    LongType,
    StringType,
    TimestamptzType,
)
from pyspark.sql import types as T

from spark_jobs.buckets import with_buckets
from spark_jobs.session import spark_session

pytestmark = pytest.mark.spark

VALUES = {
    "long": (LongType(), T.LongType(), pa.int64(), [0, 1, -1, 34, 2**31, -(2**40) + 7, 2**63 - 1, -(2**63), None]),
    "int": (IntegerType(), T.IntegerType(), pa.int32(), [0, 1, -1, 34, 2**31 - 1, -(2**31)]),
    "date": (DateType(), T.DateType(), pa.date32(), [date(1970, 1, 1), date(2017, 11, 16), date(1900, 3, 1)]),
    "ts": (TimestamptzType(), T.TimestampType(), pa.timestamp("us", tz="UTC"),
           [datetime(2017, 11, 16, 22, 31, 8, tzinfo=timezone.utc), datetime(1960, 1, 1, 0, 0, 0, 1, tzinfo=timezone.utc)]),
    "str": (StringType(), T.StringType(), pa.string(), ["", "a", "ab", "abc", "abcd", "iceberg", "user-123456789012345", "héllo wörld ☃", "日本語テキスト"]),
    "bin": (BinaryType(), T.BinaryType(), pa.binary(), [b"", b"\x00\x01\x02\x03", b"\xff" * 9]),
}


@pytest.mark.parametrize("kind", list(VALUES))
@pytest.mark.parametrize("buckets", [1, 16, 1000])
def test_spark_bucket_matches_iceberg(spark_remote: str, kind: str, buckets: int) -> None:
    iceberg_type, spark_type, arrow_type, values = VALUES[kind]
    expected = [BucketTransform(buckets).transform(iceberg_type)(_iceberg_value(kind, v)) for v in values]
    spark = spark_session(spark_remote)
    frame = spark.createDataFrame(pa.table({"i": pa.array(range(len(values))), "v": pa.array(values, type=arrow_type)}))
    assert frame.schema["v"].dataType == spark_type
    rows = with_buckets(frame, [("b", "v", buckets)]).orderBy("i").collect()
    assert [row["b"] for row in rows] == expected


def _iceberg_value(kind: str, value):  # noqa: ANN001, ANN202 - pyiceberg's transforms take its internal forms
    if value is None:
        return None
    if kind == "date":
        return (value - date(1970, 1, 1)).days
    if kind == "ts":
        delta = value - datetime(1970, 1, 1, tzinfo=timezone.utc)
        return delta.days * 86_400_000_000 + delta.seconds * 1_000_000 + delta.microseconds
    return value


@pytest.fixture(autouse=True, scope="module")
def _no_spark_client_left_in_the_test_process():  # noqa: ANN202
    # Later tests restart the Spark server; a stale in-process client would keep gRPC threads busy.
    yield
    from spark_jobs.session import close_sessions

    close_sessions()
