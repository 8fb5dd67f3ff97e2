"""Receipts: what happened to one ingest request, as it crosses Redis.

A receipt is a Redis hash, created with the input entry (api). The writer records which tables got
rows; the committer records each table's snapshot and, when every table of the receipt is
committed, flips the status and announces it on a pub/sub channel that waiting requests follow
(api/waiter.py). The record and its field names live here; the scripts that write it in scripts.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

from service.core.keys import DLQ_TABLE

# Statuses.
BUFFERED = "buffered"  # in Redis (api)
WRITTEN = "written"  # in data files, not yet committed (writer)
COMMITTED = "committed"  # every table of the request committed (committer), or nothing to commit
FAILED = "failed"  # a commit of its files can never succeed: they are parked on the table's dead commit stream

# Field names of the receipt hash; the Lua scripts in scripts.py take them from here.
STATUS = "status"
EVENTS = "events"
PIPELINE = "pipeline"
CREATED_AT = "created_at"
TABLES = "tables"  # how many tables the request's events went to (the DLQ included)
WRITTEN_AT = "written_at"
COMMITTED_AT = "committed_at"
ERROR = "error"  # why the receipt failed
WRITTEN_PREFIX = "written:"  # written:<table> = rows
COMMITTED_PREFIX = "committed:"  # committed:<table> = "<snapshot id>:<rows>"
CHANGES_PREFIX = "changes:"  # changes:<table> = JSON {inserted, updated, deleted, noop} (row changes)
DROPPED_PREFIX = "dropped:"  # dropped:<table> = JSON [names of fields no column took] (writer)
NULLED_PREFIX = "nulled:"  # nulled:<table> = JSON [columns where a value could not be converted: NULL] (writer)


def written_fields(rows_by_table: dict[str, int], now: str, dropped_by_table: dict[str, list[str]] | None = None,
                   nulled_by_table: dict[str, list[str]] | None = None) -> list[str]:
    """The writer's update of a receipt: the rows each table got (and the names of the fields no
    column of it took, and of its columns where a value could not be converted), or committed at once when its events went to no table (all filtered out or
    routed nowhere)."""
    if not rows_by_table:
        return [STATUS, COMMITTED, TABLES, "0", WRITTEN_AT, now, COMMITTED_AT, now]
    fields = [STATUS, WRITTEN, TABLES, str(len(rows_by_table)), WRITTEN_AT, now]
    for table, rows in rows_by_table.items():
        fields += [f"{WRITTEN_PREFIX}{table}", str(rows)]
    for table, names in (dropped_by_table or {}).items():
        fields += [f"{DROPPED_PREFIX}{table}", orjson.dumps(names).decode()]
    for table, names in (nulled_by_table or {}).items():
        fields += [f"{NULLED_PREFIX}{table}", orjson.dumps(names).decode()]
    return fields


@dataclass
class Receipt:
    id: str
    status: str
    events: int
    pipeline: str
    created_at: float
    tables: dict[str, dict] = field(default_factory=dict)
    error: str | None = None
    written_at: float | None = None
    committed_at: float | None = None

    def public(self) -> dict:
        body = {
            "receipt": self.id,
            "status": self.status,
            "events": self.events,
            "pipeline": self.pipeline,
            "created_at": self.created_at,
            "written_at": self.written_at,
            "committed_at": self.committed_at,
            "tables": self.tables,
            # Events of the request that went to the tenant's DLQ table instead (with their reasons).
            "dlq_events": self.tables.get(DLQ_TABLE, {}).get("rows", 0),
        }
        if self.error:
            body["error"] = self.error
        return body


def parse_receipt(receipt_id: str, raw: dict[bytes | str, bytes | str]) -> Receipt | None:
    if not raw:
        return None
    fields = {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v) for k, v in raw.items()}
    tables: dict[str, dict] = {}
    for name, value in fields.items():
        if name.startswith(WRITTEN_PREFIX):
            tables.setdefault(name[len(WRITTEN_PREFIX):], {})["rows"] = int(value)
        elif name.startswith(COMMITTED_PREFIX):
            snapshot_id, _, rows = value.partition(":")
            entry = tables.setdefault(name[len(COMMITTED_PREFIX):], {})
            entry["snapshot_id"] = int(snapshot_id)
            entry["rows"] = int(rows)
        elif name.startswith(CHANGES_PREFIX):
            tables.setdefault(name[len(CHANGES_PREFIX):], {})["changes"] = orjson.loads(value)
        elif name.startswith(DROPPED_PREFIX):
            tables.setdefault(name[len(DROPPED_PREFIX):], {})["dropped_fields"] = orjson.loads(value)
        elif name.startswith(NULLED_PREFIX):
            tables.setdefault(name[len(NULLED_PREFIX):], {})["nulled_fields"] = orjson.loads(value)
    return Receipt(
        id=receipt_id,
        status=fields.get(STATUS, BUFFERED),
        events=int(fields.get(EVENTS, 0)),
        pipeline=fields.get(PIPELINE, ""),
        created_at=float(fields.get(CREATED_AT, 0)),
        tables=tables,
        error=fields.get(ERROR),
        written_at=float(fields[WRITTEN_AT]) if WRITTEN_AT in fields else None,
        committed_at=float(fields[COMMITTED_AT]) if COMMITTED_AT in fields else None,
    )
