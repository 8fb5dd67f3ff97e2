"""What both sides of the Spark boundary agree on: the api and the writer (service/) and the jobs
(spark_jobs/). spark_jobs imports nothing of service, so these live here, and service imports
them. Only pyarrow: the api imports this module too.
"""

from __future__ import annotations

import uuid

import pyarrow as pa

# Names starting with this are Calve's own: its tables (the DLQ), the job's internal columns, and
# names a definition may not use.
INTERNAL_PREFIX = "_calve"

# The field of an input stream entry holding its request's events, NDJSON (service/protocol/
# input_entry.py); Spark's tasks read it there themselves (stream_bodies.py).
ENTRY_BODY = "body"

# An event the api set aside for the DLQ, one line of a buffered body:
# SET_ASIDE_MARK + {"reason": ..., "event": <the event's original text>}
SET_ASIDE_MARK = "!"

# A data file's Parquet key-value metadata naming the bucket partition values its task wrote it
# for: a JSON list of [source column, transform, value] (the short way's files, one bucket each;
# files.write_runs). The committer takes a file's bucket from it instead of reading the source
# column back and hashing every value (service/iceberg/appends.py); a file without it is read.
BUCKETS_METADATA = "calve.buckets"

# Each tenant's dead-letter table: its name, its key column and its schema.
DLQ_TABLE = f"{INTERNAL_PREFIX}_dlq"
DLQ_ID = "dlq_id"
DLQ_SCHEMA = pa.schema([
    pa.field(DLQ_ID, pa.string(), nullable=False),
    pa.field("event", pa.string(), nullable=False),
    pa.field("reason", pa.string(), nullable=False),
    pa.field("pipeline", pa.string(), nullable=False),
    pa.field("pipeline_version", pa.int64(), nullable=False),
    pa.field("table", pa.string()),
    pa.field("receipt", pa.string(), nullable=False),
    pa.field("failed_at", pa.timestamp("us", tz="UTC"), nullable=False),
])


# An Iceberg v2 position delete file: the data file's path and a row's place in it, by the spec's
# reserved field ids.
POSITION_DELETE_ARROW = pa.schema([
    pa.field("file_path", pa.string(), nullable=False, metadata={b"PARQUET:field_id": b"2147483546"}),
    pa.field("pos", pa.int64(), nullable=False, metadata={b"PARQUET:field_id": b"2147483545"}),
])


def new_directory(location: str, kind: str = "batch") -> str:
    """A fresh directory under a table's data location for one job's (or commit's) files."""
    return f"{location.rstrip('/')}/data/{kind}-{uuid.uuid4().hex}"


def layout_path(path: str) -> str:
    """Where a compaction's copy `path` says which rows came from where: a JSON list, per source
    file in order, of [source, its first row's place in the copy, rows it gave, the positions of
    it left out as deleted]. With it the leader deletes from the copy rows of a source deleted
    after the copy was planned (service/iceberg/folding.py)."""
    return path + ".layout.json"
