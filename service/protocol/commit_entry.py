"""Files a writer wrote for one table: an entry of the table's commit stream (writer -> committer).

One record both ways: the writer builds a CommitEntry and encodes it (`to_fields`); the committer
reads it back (`from_fields`) with the entry id its watermark compares against.

What the entry asks of the table is its Operation:
- APPEND (most entries): add the files (`registered`: files written elsewhere, registered through
  the api, which the leader checks and describes itself, and never adds twice);
- REPLACE: a compaction's rewrite, which also names the files it removes (and the position delete
  files it applied to their rows), committed as a snapshot of its own only while every one of them
  is still live and no other delete file applies to it (the rows stay the same, less the deleted);
- CHANGES: row changes (insert, update, delete by key) still to be applied: the files are the
  changes, not data files; a writer applies them against the table as it is when their turn comes
  (service/protocol/changes.py), and the leader commits that answer as one OVERWRITE.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import orjson

from service.protocol.stream_ids import text

# Field names of the stream entry.
FILES = "files"
RECEIPTS = "receipts"  # JSON {receipt: rows}
ROWS = "rows"
WRITER = "writer"
DLQ_DELETES = "dlq_deletes"  # on the DLQ table's stream: dlq_ids to remove in the same commit
COMMIT_INTERVAL = "commit_interval_s"  # the sink's commit interval, when its pipeline sets one
OPERATION = "operation"  # absent for an append (entries written before the field existed, too)
REMOVES = "removes"  # REPLACE: JSON list of the live files its files replace
REQUEST = "request"  # REPLACE: the id of the upkeep request it answers
FOLDED = "folded"  # REPLACE: JSON {file it removes: [position delete files applied to its rows]}
KEYS = "keys"  # CHANGES: JSON list of the identifier columns
UPSERT = "upsert"  # CHANGES: "1" when an update of a missing key inserts it
REGISTERED = "registered"  # APPEND: "1" when the files were written elsewhere and registered (api)
DESCRIBED = "described"  # registered files: JSON list, per file the api's description of it (or null)
# Added when the committer parks an entry on the table's dead commit stream.
DEAD_REASON = "dead_reason"
DEAD_AT = "dead_at"
DEAD_ENTRY = "dead_entry"  # the entry's id on the commit stream


class Operation(StrEnum):
    """What a commit-stream entry (or a commit made of entries) does to its table."""

    APPEND = "append"
    REPLACE = "replace"  # a compaction: the same rows in other files
    CHANGES = "changes"  # row changes waiting to be applied by a writer
    OVERWRITE = "overwrite"  # row changes a writer applied: files removed and added in one snapshot


@dataclass(frozen=True)
class CommitEntry:
    """What one Spark job wrote for one table, and what to do with it."""

    tenant: str
    table: str
    files: list[str]
    rows_by_receipt: dict[str, int]
    operation: Operation = Operation.APPEND
    deletes: list[str] = field(default_factory=list)  # DLQ table only: replayed dlq_ids to remove
    commit_interval_s: float | None = None
    removes: list[str] = field(default_factory=list)  # REPLACE: the files these replace
    request: str | None = None  # REPLACE: the compaction request it answers
    folded: dict[str, list[str]] = field(default_factory=dict)  # REPLACE: per removed file, the delete files applied
    keys: list[str] = field(default_factory=list)  # CHANGES: the identifier columns
    upsert: bool = False  # CHANGES
    registered: bool = False  # APPEND: files written elsewhere
    described: list[dict | None] = field(default_factory=list)  # registered: per file, as the api checked it
    entry_id: str = ""  # the stream entry's id, once read back

    @property
    def rows(self) -> int:
        return sum(self.rows_by_receipt.values())

    @property
    def is_rewrite(self) -> bool:
        return self.operation is Operation.REPLACE

    @property
    def is_changes(self) -> bool:
        return self.operation is Operation.CHANGES

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
        if self.registered:
            fields += [REGISTERED, "1", DESCRIBED, orjson.dumps(self.described).decode()]
        if self.operation is Operation.CHANGES:
            fields += [OPERATION, self.operation.value, KEYS, orjson.dumps(self.keys).decode(), UPSERT, "1" if self.upsert else "0"]
        elif self.operation is not Operation.APPEND:
            fields += [OPERATION, self.operation.value, REMOVES, orjson.dumps(self.removes).decode(), REQUEST, self.request or ""]
            if self.folded:
                fields += [FOLDED, orjson.dumps(self.folded).decode()]
        return fields

    def to_mapping(self, writer: str) -> dict[str, str]:
        """The stream entry as XADD takes it."""
        fields = self.to_fields(writer)
        return dict(zip(fields[::2], fields[1::2], strict=True))

    @classmethod
    def from_fields(cls, entry_id: bytes | str, fields: dict[bytes, bytes], tenant: str = "", table: str = "") -> CommitEntry:
        deletes = fields.get(DLQ_DELETES.encode())
        interval = fields.get(COMMIT_INTERVAL.encode())
        removes = fields.get(REMOVES.encode())
        operation = fields.get(OPERATION.encode())
        return cls(
            tenant=tenant,
            table=table,
            files=orjson.loads(fields[FILES.encode()]),
            rows_by_receipt=orjson.loads(fields[RECEIPTS.encode()]),
            operation=Operation(text(operation)) if operation else Operation.APPEND,
            deletes=orjson.loads(deletes) if deletes else [],
            commit_interval_s=float(interval) if interval else None,
            removes=orjson.loads(removes) if removes else [],
            request=text(fields.get(REQUEST.encode(), b"")) or None,
            keys=orjson.loads(fields[KEYS.encode()]) if KEYS.encode() in fields else [],
            upsert=fields.get(UPSERT.encode()) == b"1",
            registered=fields.get(REGISTERED.encode()) == b"1",
            described=orjson.loads(fields[DESCRIBED.encode()]) if DESCRIBED.encode() in fields else [],
            folded=orjson.loads(fields[FOLDED.encode()]) if FOLDED.encode() in fields else {},
            entry_id=text(entry_id),
        )
