"""Where a reader of a table's changes stands, as an opaque-looking but readable string.

- `origin`: before the table's first snapshot (everything is ahead).
- `load:<snapshot>:<file>:<row>`: in an initial load of `snapshot`: its first `file` data files
  (in path order) read, and `row` rows of the next one.
- `snap:<snapshot>`: every change up to and including `snapshot` read.
- `snap:<snapshot>:<n>`: the changes before `snapshot`, and the first `n` of its own (in the
  changelog's stable order), read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from service.core.exceptions import BadCursor

ORIGIN, LOAD, SNAP = "origin", "load", "snap"
_PATTERN = re.compile(r"^(?:origin|load:(\d{1,19}):(\d{1,9}):(\d{1,12})|snap:(\d{1,19})(?::(\d{1,12}))?)$")


@dataclass(frozen=True)
class Cursor:
    phase: str
    snapshot_id: int = 0
    file: int = 0  # load: data files read whole
    offset: int | None = None  # load: rows of the next file read; snap: changes of the snapshot read (None: all)

    @classmethod
    def origin(cls) -> Cursor:
        return cls(ORIGIN)

    @classmethod
    def after(cls, snapshot_id: int) -> Cursor:
        return cls(SNAP, snapshot_id)

    @classmethod
    def within(cls, snapshot_id: int, offset: int) -> Cursor:
        return cls(SNAP, snapshot_id, offset=offset)

    @classmethod
    def loading(cls, snapshot_id: int, file: int = 0, row: int = 0) -> Cursor:
        return cls(LOAD, snapshot_id, file, row)

    @classmethod
    def parse(cls, text: str) -> Cursor:
        match = _PATTERN.match(text)
        if match is None:
            raise BadCursor(f"{text!r} is not a cursor: use one this API returned (origin, load:..., snap:...)")
        load_snapshot, file, row, snapshot, offset = match.groups()
        if text == ORIGIN:
            return cls.origin()
        if load_snapshot is not None:
            return cls.loading(int(load_snapshot), int(file), int(row))
        return cls.within(int(snapshot), int(offset)) if offset is not None else cls.after(int(snapshot))

    def text(self) -> str:
        if self.phase == ORIGIN:
            return ORIGIN
        if self.phase == LOAD:
            return f"{LOAD}:{self.snapshot_id}:{self.file}:{self.offset or 0}"
        return f"{SNAP}:{self.snapshot_id}" + (f":{self.offset}" if self.offset is not None else "")

    @property
    def holds(self) -> int | None:
        """The oldest snapshot a reader at this cursor still needs, None for `origin` (all)."""
        return None if self.phase == ORIGIN else self.snapshot_id
