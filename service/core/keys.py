"""Every Redis key, channel, stream field and snapshot-summary key Calve uses, defined once.

A tenant's keys share the hash tag `{tenant}` so that the writer's transaction (record files,
acknowledge input, update receipts) stays in one Redis Cluster slot.
"""

from __future__ import annotations

PREFIX = "calve"

# Registries the writer and committer scan to find work.
INPUT_STREAMS = f"{PREFIX}:input-streams"  # set of "tenant/pipeline"
TABLES = f"{PREFIX}:tables"  # set of "tenant/table"
COMMITTED_CHANNEL = f"{PREFIX}:committed"  # pub/sub: JSON list of receipt ids now committed
AUTH_CHANNEL = f"{PREFIX}:auth-changed"  # pub/sub: a token was revoked or a tenant disabled

WRITER_GROUP = "writers"

# Fields of an input stream entry (one per HTTP request).
F_RECEIPT = "receipt"
F_EVENTS = "events"
F_BODY = "body"

# Fields of a commit stream entry (one per table per writer batch).
F_FILES = "files"
F_RECEIPTS = "receipts"
F_ROWS = "rows"
F_WRITER = "writer"

# Snapshot summary properties written by the committer.
SUMMARY_COMMIT_ID = "calve.commit-id"
SUMMARY_WATERMARK = "calve.watermark"
SUMMARY_FENCE = "calve.fence"
SUMMARY_COMMITTER = "calve.committer"

DEFAULT_PIPELINE = "logs"
DEFAULT_PIPELINE_PATH = "/logs"
DEFAULT_TABLE = "logs"
DEFAULT_TENANT = "demo"


def _tag(tenant: str) -> str:
    return f"{PREFIX}:{{{tenant}}}"


def input_stream_key(tenant: str, pipeline: str) -> str:
    return f"{_tag(tenant)}:in:{pipeline}"


def commit_stream_key(tenant: str, table: str) -> str:
    return f"{_tag(tenant)}:files:{table}"


def receipt_key(tenant: str, receipt: str) -> str:
    return f"{_tag(tenant)}:receipt:{receipt}"


def backlog_key(tenant: str) -> str:
    """Events accepted but not yet written: raised by the api, lowered by the writer."""
    return f"{_tag(tenant)}:backlog-events"


def idempotency_key(tenant: str, key_digest: str) -> str:
    return f"{_tag(tenant)}:idem:{key_digest}"


def rate_key(tenant: str, what: str) -> str:
    return f"{_tag(tenant)}:rate:{what}"


def lease_key(tenant: str, table: str) -> str:
    return f"{_tag(tenant)}:lease:{table}"


def fence_key(tenant: str, table: str) -> str:
    return f"{_tag(tenant)}:fence:{table}"


def member(tenant: str, name: str) -> str:
    """A registry set member naming one tenant's pipeline or table."""
    return f"{tenant}/{name}"


def split_member(value: str) -> tuple[str, str]:
    tenant, _, name = value.partition("/")
    return tenant, name


def dead_stream_key(tenant: str, pipeline: str) -> str:
    """Requests a Spark job could not write, kept whole with the reason."""
    return f"{_tag(tenant)}:dead:{pipeline}"
