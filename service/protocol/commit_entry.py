"""Files a writer wrote for one table: an entry of the table's commit stream (writer -> committer).

The writer builds a FilesWritten and encodes it (`to_fields`); the committer reads it back as
PendingFiles (`from_fields`), which adds the entry id its watermark compares against.

Most entries add files (an append). A rewrite entry also names files to remove, and is committed
as a snapshot of its own, only while every file it removes is still live: `replace` for a
compaction (the rows stay the same). A changes entry holds row changes (insert, update, delete by
key) still to be applied: its files are not data files but the changes, which a writer applies
copy-on-write against the table as it is when their turn comes (service/protocol/changes.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

from service.protocol.stream_ids import text

# Field names of the stream entry.
FILES = "files"
RECEIPTS = "receipts"  # JSON {receipt: rows}
ROWS = "rows"
WRITER = "writer"
DLQ_DELETES = "dlq_deletes"  # on the DLQ table's stream: dlq_ids to remove in the same commit
COMMIT_INTERVAL = "commit_interval_s"  # the sink's commit interval, when its pipeline sets one
REMOVES = "removes"  # a rewrite: JSON list of the live files its files replace
OPERATION = "operation"  # a rewrite: the snapshot's operation (REPLACE)
REQUEST = "request"  # a rewrite: the id of the upkeep request it answers
KEYS = "keys"  # changes: JSON list of the identifier columns
UPSERT = "upsert"  # changes: "1" when an update of a missing key inserts it
REPLACE = "replace"
CHANGES = "changes"
# Added when the committer parks an entry on the table's dead commit stream.
DEAD_REASON = "dead_reason"
DEAD_AT = "dead_at"
DEAD_ENTRY = "dead_entry"  # the entry's id on the commit stream


@dataclass(frozen=True)
class FilesWritten:
    """What one Spark job wrote for one table, and where it goes."""

    tenant: str
    table: str
    files: list[str]
    rows_by_receipt: dict[str, int]
    deletes: list[str] = field(default_factory=list)  # DLQ table only: replayed dlq_ids to remove
    commit_interval_s: float | None = None
    removes: list[str] = field(default_factory=list)  # a rewrite: the files these replace
    operation: str | None = None  # a rewrite: REPLACE; row changes: CHANGES
    request: str | None = None
    keys: list[str] = field(default_factory=list)  # CHANGES: the identifier columns
    upsert: bool = False

    @property
    def rows(self) -> int:
        return sum(self.rows_by_receipt.values())

    def to_fields(self, writer: str) -> list[str]:
        """The stream entry, as [field, value, ...]."""
        fields = [
            FILES, orjson.dumps(self.files).decode(),
            RECEIPTS, orjson.dumps(self.rows_by_receipt).decode(),
            ROWS, str(self.rows),
            WRITER, writer,
        ]
        if self.deletes:
            fields += [DLQ_DELETES, orjson.dumps(self.deletes).decode()]
        if self.commit_interval_s:
            fields += [COMMIT_INTERVAL, str(self.commit_interval_s)]
        if self.operation == CHANGES:
            fields += [OPERATION, CHANGES, KEYS, orjson.dumps(self.keys).decode(), UPSERT, "1" if self.upsert else "0"]
        elif self.operation:
            fields += [REMOVES, orjson.dumps(self.removes).decode(), OPERATION, self.operation, REQUEST, self.request or ""]
        return fields


@dataclass(frozen=True)
class PendingFiles:
    """A commit-stream entry as the committer reads it back."""

    entry_id: str
    files: list[str]
    rows_by_receipt: dict[str, int]
    deletes: list[str] = field(default_factory=list)
    commit_interval_s: float | None = None
    removes: list[str] = field(default_factory=list)
    operation: str | None = None
    request: str | None = None
    keys: list[str] = field(default_factory=list)
    upsert: bool = False

    @property
    def is_rewrite(self) -> bool:
        return self.operation == REPLACE

    @property
    def is_changes(self) -> bool:
        return self.operation == CHANGES

    @classmethod
    def from_fields(cls, entry_id: bytes | str, fields: dict[bytes, bytes]) -> PendingFiles:
        deletes = fields.get(DLQ_DELETES.encode())
        interval = fields.get(COMMIT_INTERVAL.encode())
        removes = fields.get(REMOVES.encode())
        operation = fields.get(OPERATION.encode())
        return cls(
            text(entry_id),
            orjson.loads(fields[FILES.encode()]),
            orjson.loads(fields[RECEIPTS.encode()]),
            orjson.loads(deletes) if deletes else [],
            float(interval) if interval else None,
            orjson.loads(removes) if removes else [],
            text(operation) if operation else None,
            text(fields.get(REQUEST.encode(), b"")) or None,
            orjson.loads(fields[KEYS.encode()]) if KEYS.encode() in fields else [],
            fields.get(UPSERT.encode()) == b"1",
        )
