"""Applying row changes: the table's leader asks, a writer answers (committer <-> writer).

Row changes must apply in commit order, against the table with every earlier entry in it. So the
writer that handled the events only keeps them (a changes entry on the commit stream); when the
entry's turn comes, the leader asks a writer to apply it and the changes entries right after it
(ApplyRequest: which entries, against which snapshot), waits, and commits the answer (ApplyResult:
files removed and added, position delete files (merge-on-read), counts per receipt) as one
overwrite, if the table is still at that
snapshot. Both records live in the table's `applying_key` hash, which expires: a request lost with
a crashed writer is asked again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

REQUEST = "request"  # fields of the applying_key hash
RESULT = "result"


@dataclass(frozen=True)
class ApplyRequest:
    tenant: str
    table: str
    request: str  # id
    base_snapshot: int | None  # the table's current snapshot when asked
    entries: list[tuple[str, list[str]]]  # (entry id, its change files), in commit order
    keys: list[str]
    upsert: bool
    unseen: list[str] = field(default_factory=list)  # data files committed ahead of these changes: never candidates

    @property
    def last_entry(self) -> str:
        return self.entries[-1][0]

    def to_json(self) -> bytes:
        return orjson.dumps({
            "tenant": self.tenant, "table": self.table, "request": self.request, "base_snapshot": self.base_snapshot,
            "entries": [[entry_id, files] for entry_id, files in self.entries], "keys": self.keys, "upsert": self.upsert,
            "unseen": self.unseen,
        })

    @classmethod
    def from_json(cls, raw: bytes | str) -> ApplyRequest:
        body = orjson.loads(raw)
        return cls(body["tenant"], body["table"], body["request"], body["base_snapshot"],
                   [(entry_id, files) for entry_id, files in body["entries"]], body["keys"], body["upsert"], body.get("unseen", []))


@dataclass(frozen=True)
class ApplyResult:
    request: str
    base_snapshot: int | None
    removes: list[str] = field(default_factory=list)
    adds: list[str] = field(default_factory=list)
    counts: dict[str, dict[str, int]] = field(default_factory=dict)  # receipt -> inserted/updated/deleted/noop
    error: str | None = None
    # merge-on-read: [position delete file, the data file it applies to, rows, bytes, and (absent
    # in older answers: none) the delete files of that data file it replaces, holding their rows too]
    deletes: list[list] = field(default_factory=list)

    @property
    def written(self) -> list[str]:
        """Every file the writer wrote for this answer."""
        return self.adds + [delete[0] for delete in self.deletes]

    def to_json(self) -> bytes:
        return orjson.dumps(self.__dict__)

    @classmethod
    def from_json(cls, raw: bytes | str) -> ApplyResult:
        return cls(**orjson.loads(raw))
