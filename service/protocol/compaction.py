"""A compaction request: a table's leader asks a writer to rewrite small files (committer -> writer).

The leader plans from table metadata which files to merge (and, merge-on-read, which position
delete files to apply to their rows as they are copied); a writer runs the Spark job and hands
the result back as a rewrite entry on the table's commit stream (commit_entry.REPLACE). Requests
travel on a plain list: one lost with a crashed writer is planned again once its table's
`compacting_key` expires, and a duplicate is harmless (the second rewrite of the same files finds
them replaced and is dropped at commit).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson


@dataclass(frozen=True)
class CompactionRequest:
    tenant: str
    table: str
    request: str  # id, carried to the rewrite entry and the table's upkeep record
    groups: list[tuple[list[str], int]]  # per partition: (files to merge, files to write)
    deletes: dict[str, list[str]] = field(default_factory=dict)  # per file with deleted rows: its position delete files

    @property
    def files(self) -> list[str]:
        return [path for paths, _outputs in self.groups for path in paths]

    def to_json(self) -> bytes:
        return orjson.dumps({"tenant": self.tenant, "table": self.table, "request": self.request,
                             "groups": [[paths, outputs] for paths, outputs in self.groups], "deletes": self.deletes})

    @classmethod
    def from_json(cls, raw: bytes | str) -> CompactionRequest:
        body = orjson.loads(raw)
        return cls(body["tenant"], body["table"], body["request"], [(paths, int(outputs)) for paths, outputs in body["groups"]],
                   body.get("deletes") or {})
