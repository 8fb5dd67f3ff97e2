"""Reading a table's changes from a cursor: as one stream (GET /v1/tables/{name}/changes) or as
pages of at most `limit` rows that end at a cursor (a consumer's next changes)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pyarrow as pa
from cachetools import LRUCache
from pyiceberg.table import Table

from service.feeds.cursors import LOAD, ORIGIN, Cursor
from service.iceberg.changelog import Changelog, SnapshotChanges, SnapshotFiles, lineage, missing_snapshot, snapshot_files

# A batch of change rows, and the cursor after its first n rows.
Positioned = tuple[pa.RecordBatch, Callable[[int], Cursor]]
EMPTY = pa.RecordBatch.from_pylist([])

# Planned snapshots (a full read of their files each: see changelog.py), so that paging through
# a large one plans it once. Keyed by table, snapshot and schema; sized by the masks' bytes.
_PLANS: LRUCache = LRUCache(maxsize=64 * 1024 * 1024, getsizeof=lambda plan: 64 + sum(
    mask.nbytes for mask in (plan.keep_removed, plan.keep_added, plan.update_removed, plan.update_added,
                             *(plan.removed_rows or ()), *(plan.added_rows or ())) if mask is not None
))
_PLANS_LOCK = threading.Lock()


# Computes a large snapshot's changes elsewhere (feeds/spark_diffs.py), or returns None.
Differ = Callable[[Changelog, SnapshotFiles], "SnapshotChanges | None"]


def _key(changelog: Changelog, snapshot_id: int) -> tuple:
    return str(changelog.table.metadata.table_uuid), snapshot_id, changelog.schema.schema_id


def _cached(changelog: Changelog, snapshot_id: int) -> SnapshotChanges | None:
    with _PLANS_LOCK:
        return _PLANS.get(_key(changelog, snapshot_id))


def _plan(changelog: Changelog, snapshot_id: int, differ: Differ | None) -> SnapshotChanges:
    table = changelog.table
    plan = _cached(changelog, snapshot_id)
    if plan is None:
        snapshot = table.metadata.snapshot_by_id(snapshot_id)
        if snapshot is None:
            raise missing_snapshot(table, snapshot_id)
        files = snapshot_files(table, snapshot)
        plan = (differ(changelog, files) if differ is not None else None) or changelog.plan(files)
        with _PLANS_LOCK:
            _PLANS[_key(changelog, snapshot_id)] = plan
    return plan


def _snapshot_rows(changelog: Changelog, snapshot_id: int, skip: int, differ: Differ | None) -> Iterator[Positioned]:
    position = skip
    for batch in changelog.rows(_plan(changelog, snapshot_id, differ), skip):
        start = position
        position += batch.num_rows
        yield batch, lambda n, start=start: Cursor.within(snapshot_id, start + n)
    yield EMPTY, lambda _n: Cursor.after(snapshot_id)


def _load_rows(changelog: Changelog, cursor: Cursor) -> Iterator[Positioned]:
    snapshot = changelog.table.metadata.snapshot_by_id(cursor.snapshot_id)
    if snapshot is None:
        raise missing_snapshot(changelog.table, cursor.snapshot_id)
    files = changelog.load(snapshot)
    for index in range(cursor.file, len(files)):
        row = (cursor.offset or 0) if index == cursor.file else 0
        for batch in changelog.file_rows(snapshot, files[index], row):
            start = row
            row += batch.num_rows
            yield batch, lambda n, index=index, start=start: Cursor.loading(snapshot.snapshot_id, index, start + n)
        yield EMPTY, lambda _n, index=index: Cursor.loading(snapshot.snapshot_id, index + 1, 0)
    yield EMPTY, lambda _n: Cursor.after(snapshot.snapshot_id)


def stream(table: Table, cursor: Cursor, to_id: int | None = None, differ: Differ | None = None) -> Iterator[Positioned]:
    """Every change after `cursor` up to snapshot `to_id` (default: the current one), in order.
    What cannot be read (a snapshot expired, a history that does not pass through the cursor,
    equality delete files) raises before the first row is yielded."""
    changelog = Changelog(table)
    if cursor.phase == LOAD:
        first: Iterator[Positioned] = _load_rows(changelog, cursor)
        after: int | None = cursor.snapshot_id
    elif cursor.phase == ORIGIN:
        first, after = iter(()), None
    elif cursor.offset is not None:  # within a snapshot: finish it, then go on after it
        first, after = _snapshot_rows(changelog, cursor.snapshot_id, cursor.offset, differ), cursor.snapshot_id
    else:
        first, after = iter(()), cursor.snapshot_id
    snapshots = lineage(table, after, to_id)
    for snapshot in snapshots:  # refuses equality delete files before anything is sent (a planned one has none)
        if _cached(changelog, snapshot.snapshot_id) is None:
            snapshot_files(table, snapshot)
    yield from first
    for snapshot in snapshots:
        yield from _snapshot_rows(changelog, snapshot.snapshot_id, 0, differ)


@dataclass
class Page:
    batches: list[pa.RecordBatch] = field(default_factory=list)
    rows: int = 0
    cursor: Cursor | None = None
    more: bool = False  # stopped at the limit, not at the end


def read_page(table: Table, cursor: Cursor, limit: int, differ: Differ | None = None) -> Page:
    """At most `limit` change rows after `cursor`, and the cursor after them."""
    page = Page(cursor=cursor)
    for batch, cursor_after in stream(table, cursor, differ=differ):
        if page.rows >= limit and batch.num_rows:
            page.more = True
            break
        take = min(batch.num_rows, limit - page.rows)
        if take:
            page.batches.append(batch.slice(0, take))
            page.rows += take
        page.cursor = cursor_after(take)
        if take < batch.num_rows:
            page.more = True
            break
    return page
