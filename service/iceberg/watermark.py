"""The committer's watermark: the last commit-stream entry a table holds, read from the summaries
of the snapshots Calve's committer made (see the package docstring for why it is safe), and the
entries it holds beyond it.

Every entry up to the watermark is in the table. Appends queued behind row changes that are not
applied yet may be committed ahead of them (committer/commits.py): the snapshot then names them
as runs of stream ids beyond the watermark (`calve.ahead`, "first:last,first:last"), every entry
of the stream within a run being in the table. The watermark moves on over them once the entries
before them are committed (`advance`).
"""

from __future__ import annotations

from collections.abc import Iterator

from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from service.core.keys import SUMMARY_AHEAD, SUMMARY_WATERMARK
from service.protocol.stream_ids import parse_id

Runs = tuple[tuple[str, str], ...]  # (first, last) stream ids of entries committed beyond the watermark, in order


def calve_snapshots(table: Table) -> list[Snapshot]:
    """Snapshots that Calve's committer made, newest first.

    Walks the current branch's ancestry, so a maintenance commit on top (which carries no
    watermark) does not hide the last watermark.
    """
    return list(_calve_ancestry(table))


def _calve_ancestry(table: Table) -> Iterator[Snapshot]:
    snapshot = table.current_snapshot()
    while snapshot is not None:
        if snapshot.summary is not None and SUMMARY_WATERMARK in snapshot.summary.additional_properties:
            yield snapshot
        if snapshot.parent_snapshot_id is None:
            break
        snapshot = table.snapshot_by_id(snapshot.parent_snapshot_id)


def watermark(table: Table) -> str:
    """The last commit-stream entry id already in the table ("0-0" when none is)."""
    for snapshot in _calve_ancestry(table):  # the newest only
        return snapshot.summary.additional_properties[SUMMARY_WATERMARK]
    return "0-0"


def appended_ahead_since(table: Table, base: int | None) -> bool:
    """Whether every snapshot after `base` (None: the table's start) up to the current one is
    appends committed ahead of row changes: what row changes applied against `base` never see."""
    snapshot = table.current_snapshot()
    while snapshot is not None and snapshot.snapshot_id != base:
        summary = snapshot.summary
        if summary is None or summary.operation.value != "append" or SUMMARY_AHEAD not in summary.additional_properties:
            return False
        snapshot = table.snapshot_by_id(snapshot.parent_snapshot_id) if snapshot.parent_snapshot_id is not None else None
    return snapshot is not None or base is None


def ahead(table: Table) -> Runs:
    """The runs of entries the table holds beyond its watermark (none, mostly)."""
    for snapshot in _calve_ancestry(table):  # the newest only
        return parse_runs(snapshot.summary.additional_properties.get(SUMMARY_AHEAD, ""))
    return ()


def parse_runs(text: str) -> Runs:
    return tuple((first, last) for first, _, last in (run.partition(":") for run in text.split(",") if run))


def spell_runs(runs: Runs) -> str:
    return ",".join(f"{first}:{last}" for first, last in runs)


def within(entry_id: str, runs: Runs) -> bool:
    """Whether the entry is one the runs say the table holds."""
    at = parse_id(entry_id)
    return any(parse_id(first) <= at <= parse_id(last) for first, last in runs)


def advance(mark: str, runs: Runs, stream: list[str], committed: set[str]) -> tuple[str, Runs]:
    """The watermark and runs once `committed` is in the table too: `stream` lists the commit
    stream's entry ids after `mark` (up to the last of `committed` and of `runs`, at least), in
    order. The watermark moves over every entry in the table from `mark` on, and the runs are the
    entries in the table after the first one that is not."""
    new_runs: list[list[str]] = []
    gap = extend = False
    for entry_id in stream:
        if not (entry_id in committed or within(entry_id, runs)):
            gap, extend = True, False
        elif not gap:
            mark = entry_id
        elif extend:
            new_runs[-1][1] = entry_id
        else:
            new_runs.append([entry_id, entry_id])
            extend = True
    return mark, tuple((first, last) for first, last in new_runs)
