"""Every Redis key and channel and every snapshot-summary key Calve uses, built and parsed here
(the fields of the records that cross Redis are in service/protocol).

A tenant's keys share the hash tag `{tenant}` so that the writer's transaction (record files,
acknowledge input, update receipts) stays in one Redis Cluster slot.
"""

from __future__ import annotations

from spark_jobs import contract

PREFIX = "calve"

# Registries the writer and committer scan to find work.
INPUT_STREAMS = f"{PREFIX}:input-streams"  # set of "tenant/pipeline"
TABLES = f"{PREFIX}:tables"  # set of "tenant/table"
COMMITTED_CHANNEL = f"{PREFIX}:committed"  # pub/sub: receipts now settled, JSON: a list of ids, or ids to their fields
AUTH_CHANNEL = f"{PREFIX}:auth-changed"  # pub/sub: a token was revoked or a tenant disabled
PIPELINES_CHANNEL = f"{PREFIX}:pipelines-changed"  # pub/sub: a pipeline was created, replaced or deleted

WRITER_GROUP = "writers"
MAINTENANCE = f"{PREFIX}:maintenance"  # set of "tenant/table" with upkeep asked for by hand
APPLIES = f"{PREFIX}:applies"  # list: requests to apply row changes (JSON), leaders push, writers pop
COMPACTIONS = f"{PREFIX}:compactions"  # list: compaction requests (JSON), leaders push, writers pop
FEED_DIFFS = f"{PREFIX}:feed-diffs"  # list: a snapshot's changes to compute on Spark (JSON), feed readers push, writers pop
HEARTBEATS = f"{PREFIX}:heartbeats"  # hash: "<role>/<name>" -> JSON {at, ...} (protocol/heartbeats.py)

# Snapshot summary properties written by the committer.
SUMMARY_COMMIT_ID = "calve.commit-id"
SUMMARY_WATERMARK = "calve.watermark"
SUMMARY_AHEAD = "calve.ahead"  # entries committed beyond the watermark: "first:last" runs of stream ids (iceberg/watermark.py)
SUMMARY_FENCE = "calve.fence"
SUMMARY_COMMITTER = "calve.committer"
SUMMARY_REGISTERED = "calve.registered-files"  # files written elsewhere that the snapshot added

DEFAULT_PIPELINE = "logs"
DEFAULT_PIPELINE_PATH = "/logs"
DEFAULT_TABLE = "logs"
OTEL_LOGS_PIPELINE = "otel_logs"  # the built-in pipeline (and table) of OpenTelemetry log records
LOKI_LOGS_PIPELINE = "loki_logs"  # the built-in pipeline (and table) of lines pushed with Loki's API
# Each tenant's dead-letter table and its key column; names starting with _calve are Calve's own
# (shared with the Spark jobs: spark_jobs/contract.py).
DLQ_TABLE = contract.DLQ_TABLE
RESERVED_TABLE_PREFIX = contract.INTERNAL_PREFIX
DLQ_ID = contract.DLQ_ID
DEFAULT_TENANT = "demo"


def _tag(tenant: str) -> str:
    return f"{PREFIX}:{{{tenant}}}"


def input_stream_key(tenant: str, pipeline: str) -> str:
    return f"{_tag(tenant)}:in:{pipeline}"


def parse_input_stream_key(key: str) -> tuple[str, str]:
    """(tenant, pipeline) of an input_stream_key."""
    tag, _, pipeline = key.partition("}:in:")
    return tag.rpartition("{")[2], pipeline


def commit_stream_key(tenant: str, table: str) -> str:
    return f"{_tag(tenant)}:files:{table}"


def dead_commit_stream_key(tenant: str, table: str) -> str:
    """Commit-stream entries the committer gave up on (a commit of them can never succeed)."""
    return f"{_tag(tenant)}:dead-files:{table}"


def receipt_key(tenant: str, receipt: str) -> str:
    return f"{_tag(tenant)}:receipt:{receipt}"


def backlog_key(tenant: str) -> str:
    """Events accepted but not yet committed: raised by the api, lowered when their receipt
    completes (by the committer, or by the writer for a request with nothing to commit)."""
    return f"{_tag(tenant)}:backlog-events"


def idempotency_key(tenant: str, key_digest: str) -> str:
    return f"{_tag(tenant)}:idem:{key_digest}"


def rate_key(tenant: str, what: str) -> str:
    return f"{_tag(tenant)}:rate:{what}"


def lease_key(tenant: str, table: str) -> str:
    return f"{_tag(tenant)}:lease:{table}"


def heavy_lane_key(tenant: str) -> str:
    """String: the writer running the tenant's heavy batch now (service/writer/lanes.py)."""
    return f"{_tag(tenant)}:heavy-lane"


def upkeep_key(tenant: str, table: str) -> str:
    """Hash: the last run of each upkeep task of the table (JSON per task)."""
    return f"{_tag(tenant)}:upkeep:{table}"


def maintenance_key(tenant: str, table: str) -> str:
    """Hash: upkeep task -> id of the request that asked for it now (POST .../maintenance)."""
    return f"{_tag(tenant)}:maintenance:{table}"


def applying_key(tenant: str, table: str) -> str:
    """Hash: the table's row changes being applied now: `request` and, once done, `result` (JSON)."""
    return f"{_tag(tenant)}:applying:{table}"


def feed_diff_key(tenant: str, table: str, snapshot_id: int, schema_id: int) -> str:
    """Hash: one snapshot's changes computed on Spark (in the table's schema `schema_id`):
    `request` while a writer computes them, then `result` (JSON: the Parquet files, or an error)."""
    return f"{_tag(tenant)}:feed-diff:{table}:{snapshot_id}:{schema_id}"


def compacting_key(tenant: str, table: str) -> str:
    """Set (with a time limit) while a compaction of the table is requested or running: its id."""
    return f"{_tag(tenant)}:compacting:{table}"


def fence_key(tenant: str, table: str) -> str:
    return f"{_tag(tenant)}:fence:{table}"


def member(tenant: str, name: str) -> str:
    """A registry set member naming one tenant's pipeline or table."""
    return f"{tenant}/{name}"


def split_member(value: str) -> tuple[str, str]:
    tenant, _, name = value.partition("/")
    return tenant, name


def registered_file_key(tenant: str, table: str, digest: str) -> str:
    """String (with a time to live): a file path, or a caller's deduplication key, already
    registered into the table; its value is the registration's receipt."""
    return f"{_tag(tenant)}:registered:{table}:{digest}"


def registrations_key(tenant: str, table: str) -> str:
    """List: the table's most recent file registrations, newest first (JSON each)."""
    return f"{_tag(tenant)}:registrations:{table}"


def dlq_replay_lock_key(tenant: str, dlq_id: str) -> str:
    """Held while a DLQ entry is being replayed, so a second replay skips it."""
    return f"{_tag(tenant)}:dlq-replaying:{dlq_id}"
