"""The committer's watermark: the last commit-stream entry a table holds, read from the summaries
of the snapshots Calve's committer made (see the package docstring for why it is safe)."""

from __future__ import annotations

from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from service.core.keys import SUMMARY_WATERMARK


def calve_snapshots(table: Table) -> list[Snapshot]:
    """Snapshots that Calve's committer made, newest first.

    Walks the current branch's ancestry, so a maintenance commit on top (which carries no
    watermark) does not hide the last watermark.
    """
    snapshots: list[Snapshot] = []
    snapshot = table.current_snapshot()
    while snapshot is not None:
        if snapshot.summary is not None and SUMMARY_WATERMARK in snapshot.summary.additional_properties:
            snapshots.append(snapshot)
        if snapshot.parent_snapshot_id is None:
            break
        snapshot = table.snapshot_by_id(snapshot.parent_snapshot_id)
    return snapshots


def watermark(table: Table) -> str:
    """The last commit-stream entry id already in the table ("0-0" when none is)."""
    for snapshot in calve_snapshots(table):
        return snapshot.summary.additional_properties[SUMMARY_WATERMARK]
    return "0-0"
