"""What both sides of the Spark boundary agree on: the api and the writer (service/) and the jobs
(spark_jobs/). spark_jobs imports nothing of service, so these live here, and service imports
them. Only pyarrow: the api imports this module too.
"""

from __future__ import annotations

import pyarrow as pa

# Names starting with this are Calve's own: its tables (the DLQ), the job's internal columns, and
# names a definition may not use.
INTERNAL_PREFIX = "_calve"

# An event the api set aside for the DLQ, one line of a buffered body:
# SET_ASIDE_MARK + {"reason": ..., "event": <the event's original text>}
SET_ASIDE_MARK = "!"

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
