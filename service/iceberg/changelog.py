"""Row-level changes of a table between two snapshots, and a full read of one: what the change
feed serves.

A snapshot's changes are the rows it removed (`DELETE`) and added (`INSERT`), less carryover.
Removed rows are those of the data files it removed (less the rows position deletes had already
deleted) and, merge-on-read, the rows its new position delete files delete from files it kept
(less those deleted before); added rows are those of the data files it added (less any rows its
own delete files delete from them). Equality delete files are refused: which rows they delete
cannot be told without reading the whole table. Carryover is rows a copy-on-write rewrite removed and added again unchanged. Carryover is
found by full-row equality, counted as a multiset (a row removed twice and added once leaves one
`DELETE`). With identifier columns, a key both removed and added by one snapshot is an update:
its removed row is `UPDATE_BEFORE`, its added row `UPDATE_AFTER`. A `replace` snapshot
(compaction, manifest merges) moves rows between files without changing them: it has no changes.

Memory is bounded by the number of rows, not their size: a first pass reads the snapshot's files
and keeps 16 bytes per row (a 128-bit row hash: two 64-bit hashes with different seeds, in polars)
plus the same for the identifier values; it finds the carryover and the updated keys (polars
group-bys and joins) and keeps a flag or two per row; a second pass reads the files again, batch by batch, and drops or labels each row. A
hash collision between a removed and a different added row would hide both as carryover: with 128
bits and n rows its chance is about n^2 / 2^129.

Rows are read in the table's current schema (columns matched by field id: added columns read as
null in older files). The order within a snapshot is stable: the removed rows, then the added
rows, each by data file in path order, rows in file order. So an offset into a snapshot's changes names the
same row every time they are read, which is what consumer cursors count on.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    ManifestEntryStatus,
)
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation, Snapshot

from service.core.exceptions import DeleteFilesFound, HistoryExpired, NotAnAncestor, ReservedColumn, SnapshotMissing, SnapshotUnknown
from service.iceberg.files import locate
from service.iceberg.folding import deleted_positions
from service.iceberg.private import file_batches
from service.iceberg.rewrites import deletes_by_file, live_files

CHANGE_TYPE = "_change_type"
SNAPSHOT_ID = "_snapshot_id"
COMMITTED_AT = "_committed_at"
DOCUMENT_ID = "_document_id"
METADATA_COLUMNS = (CHANGE_TYPE, SNAPSHOT_ID, COMMITTED_AT, DOCUMENT_ID)
INSERT, DELETE, UPDATE_BEFORE, UPDATE_AFTER = "INSERT", "DELETE", "UPDATE_BEFORE", "UPDATE_AFTER"
# Identifier values joined into a document id as the reference design does ("us-electronics").
DOCUMENT_ID_SEPARATOR = "-"


@dataclass(frozen=True)
class Part:
    """Rows of one data file on one side of a snapshot's changes: every row (`only` None) or only
    the rows the position delete files `only` name, less the rows the delete files `without` name."""

    file: DataFile
    only: tuple[DataFile, ...] | None = None
    without: tuple[DataFile, ...] = ()

    @property
    def whole(self) -> bool:
        return self.only is None and not self.without


@dataclass(frozen=True)
class SnapshotFiles:
    """What one snapshot removed and added, each side by data file in path order."""

    snapshot: Snapshot
    removed: tuple[Part, ...]
    added: tuple[Part, ...]

    @property
    def rearranges_only(self) -> bool:
        return self.snapshot.summary is not None and self.snapshot.summary.operation == Operation.REPLACE

    @property
    def whole_files(self) -> bool:
        """Whether every side is whole data files (no position deletes to apply)."""
        return all(part.whole for part in (*self.removed, *self.added))


def _name(table: Table) -> str:
    return ".".join(table.name()[1:]) or ".".join(table.name())


def is_first(snapshot: Snapshot) -> bool:
    """Whether `snapshot` began the table's history. Its parent id cannot tell alone: pyiceberg's
    snapshot expiry clears the parent id of the oldest snapshot it keeps. In v2 tables the first
    snapshot has sequence number 1; in v1 tables, its totals are what it added."""
    if snapshot.parent_snapshot_id is not None:
        return False
    if snapshot.sequence_number:
        return snapshot.sequence_number == 1
    summary = snapshot.summary
    return summary is None or (summary["total-records"] or "0") == (summary["added-records"] or "0")


def missing_snapshot(table: Table, snapshot_id: int) -> SnapshotMissing:
    """The error for a snapshot id the table does not hold: unknown (404) when it cannot have been
    one of the table's (Iceberg's ids are positive, and a table whose oldest snapshot began its
    history expired none), else missing (410: expired, or never one; the metadata cannot tell)."""
    snapshots = table.metadata.snapshots
    if snapshot_id <= 0 or not snapshots or is_first(min(snapshots, key=lambda s: (s.timestamp_ms, s.sequence_number or 0))):
        return SnapshotUnknown(_name(table), snapshot_id)
    return SnapshotMissing(_name(table), snapshot_id)


def lineage(table: Table, from_id: int | None, to_id: int | None = None) -> list[Snapshot]:
    """The snapshots after `from_id` (exclusive; None: from the table's first) up to `to_id`
    (default: the current one), oldest first."""
    metadata = table.metadata
    for wanted in (from_id, to_id):
        if wanted is not None and metadata.snapshot_by_id(wanted) is None:
            raise missing_snapshot(table, wanted)
    snapshot = metadata.snapshot_by_id(to_id) if to_id is not None else table.current_snapshot()
    newest_first: list[Snapshot] = []
    while snapshot is not None and snapshot.snapshot_id != from_id:
        newest_first.append(snapshot)
        parent = metadata.snapshot_by_id(snapshot.parent_snapshot_id) if snapshot.parent_snapshot_id is not None else None
        if parent is None and is_first(snapshot):
            snapshot = None
            break
        if parent is None:
            if from_id is None:
                raise HistoryExpired(_name(table), snapshot)
            break
        snapshot = parent
    if from_id is not None and (snapshot is None or snapshot.snapshot_id != from_id):
        raise NotAnAncestor(_name(table), from_id, to_id if to_id is not None else metadata.current_snapshot_id or 0)
    return list(reversed(newest_first))


def _refuse_equality_deletes(table: Table, deletes: list[DataFile]) -> list[DataFile]:
    """`deletes`, once none is an equality delete file (DeleteFilesFound)."""
    for delete in deletes:
        if delete.content == DataFileContent.EQUALITY_DELETES:
            raise DeleteFilesFound(_name(table), delete.content)
    return deletes


def _own_entries(table: Table, snapshot: Snapshot) -> tuple[list[DataFile], list[DataFile], list[DataFile]]:
    """The data files `snapshot` removed and added, and the delete files it added (from the
    manifests it wrote)."""
    removed: list[DataFile] = []
    added: list[DataFile] = []
    new_deletes: list[DataFile] = []
    for manifest in snapshot.manifests(table.io):
        if manifest.added_snapshot_id != snapshot.snapshot_id:
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
            if entry.snapshot_id != snapshot.snapshot_id or entry.status == ManifestEntryStatus.EXISTING:
                continue
            if entry.data_file.content == DataFileContent.DATA:
                (added if entry.status == ManifestEntryStatus.ADDED else removed).append(entry.data_file)
            elif entry.status == ManifestEntryStatus.ADDED:
                new_deletes.append(entry.data_file)
            # A delete file removed goes with its data file, or is folded into a rewrite (`replace`): no row changes.
    return removed, added, new_deletes


def _before(table: Table, snapshot: Snapshot, added: list[DataFile], new_deletes: list[DataFile]) -> tuple[dict[str, DataFile], list[DataFile]]:
    """The data files (by path) and delete files live just before `snapshot`: its parent's, or,
    once the parent is expired, its own less what it added."""
    parent = table.metadata.snapshot_by_id(snapshot.parent_snapshot_id) if snapshot.parent_snapshot_id is not None else None
    if parent is not None:
        return live_files(table, parent.snapshot_id)
    if is_first(snapshot):
        return {}, []
    data, deletes = live_files(table, snapshot.snapshot_id)
    added_paths = {file.file_path for file in added}
    new_paths = {file.file_path for file in new_deletes}
    return ({path: file for path, file in data.items() if path not in added_paths},
            [file for file in deletes if file.file_path not in new_paths])


def snapshot_files(table: Table, snapshot: Snapshot) -> SnapshotFiles:
    """What `snapshot` removed and added (from its manifests and its parent's; no data file or
    delete file is read). Equality delete files it added, or that applied to the files it
    changed, are refused (DeleteFilesFound): their rows' changes cannot be told from them."""
    removed, added, new_deletes = _own_entries(table, snapshot)
    _refuse_equality_deletes(table, new_deletes)
    by_path = lambda part: part.file.file_path  # noqa: E731
    if not removed and not new_deletes or snapshot.summary is not None and snapshot.summary.operation == Operation.REPLACE:
        return SnapshotFiles(snapshot, tuple(sorted(map(Part, removed), key=by_path)), tuple(sorted(map(Part, added), key=by_path)))
    data, deletes = _before(table, snapshot, added, new_deletes)
    before = deletes_by_file(data, deletes)
    now = deletes_by_file({**data, **{file.file_path: file for file in added}}, new_deletes)
    gone = {file.file_path for file in removed}
    removed_parts = [Part(file, None, tuple(_refuse_equality_deletes(table, before.get(file.file_path, [])))) for file in removed]
    removed_parts += [
        Part(data[path], tuple(files), tuple(_refuse_equality_deletes(table, before.get(path, []))))
        for path, files in now.items() if path in data and path not in gone
    ]
    added_parts = [Part(file, None, tuple(now.get(file.file_path, ()))) for file in added]
    return SnapshotFiles(snapshot, tuple(sorted(removed_parts, key=by_path)), tuple(sorted(added_parts, key=by_path)))


def _hashable(batch: pa.RecordBatch) -> pl.DataFrame:
    columns = [column.storage if isinstance(column.type, pa.ExtensionType) else column for column in batch.columns]
    return pl.from_arrow(pa.RecordBatch.from_arrays(columns, names=batch.schema.names))


KEY = ("h1", "h2")


def _keys(frame: pl.DataFrame) -> pl.DataFrame:
    """128 bits per row: two 64-bit row hashes with different seeds."""
    return pl.DataFrame({"h1": frame.hash_rows(seed=1), "h2": frame.hash_rows(seed=2)})


def _keep_beyond(keys: pl.DataFrame, counts: pl.DataFrame, carry: pl.DataFrame) -> np.ndarray:
    """Per row (in order): False for the first `carry` rows of each key, True after them."""
    carried = keys.join(carry, on=KEY, how="left", maintain_order="left")["carry"].fill_null(0)
    if counts.is_empty() or counts["len"].max() <= 1:  # every row unique on its side: the usual case
        return (carried == 0).to_numpy()
    rank = keys.select(pl.int_range(pl.len()).over(KEY)).to_series()
    return (rank >= carried).to_numpy()


def _in_both(left: pl.DataFrame, right: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Per row of each side: whether its key is also on the other side."""
    return left.select(pl.struct(KEY).is_in(right.select(pl.struct(KEY)).to_series())).to_series().to_numpy(), \
        right.select(pl.struct(KEY).is_in(left.select(pl.struct(KEY)).to_series())).to_series().to_numpy()


@dataclass
class SnapshotChanges:
    """One snapshot's changes, planned: per removed and added row, whether it is emitted and
    whether it is one side of an update. `None` masks: every row emitted, none an update."""

    files: SnapshotFiles
    keep_removed: np.ndarray | None = None
    keep_added: np.ndarray | None = None
    update_removed: np.ndarray | None = None
    update_added: np.ndarray | None = None
    # Per part of each side: the positions of its rows in its data file, sorted (None: every row).
    removed_rows: list[np.ndarray | None] | None = None
    added_rows: list[np.ndarray | None] | None = None
    # Computed on Spark instead (service/protocol/feeds.py): Parquet files of the changes in order.
    spilled: list[str] | None = None
    spilled_rows: int = 0

    @property
    def count(self) -> int:
        if self.files.rearranges_only:
            return 0
        if self.spilled is not None:
            return self.spilled_rows
        removed = _rows(self.files.removed, self.removed_rows) if self.keep_removed is None else int(self.keep_removed.sum())
        added = _rows(self.files.added, self.added_rows) if self.keep_added is None else int(self.keep_added.sum())
        return removed + added


def _rows(parts: tuple[Part, ...], selections: list[np.ndarray | None] | None) -> int:
    return sum(_part_rows(part, selection) for part, selection in zip(parts, selections or [None] * len(parts), strict=True))


def _part_rows(part: Part, selection: np.ndarray | None) -> int:
    return part.file.record_count if selection is None else len(selection)


class Changelog:
    """Reads one table's changes and rows in its current schema, with the feed's columns."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self.schema: Schema = table.schema()
        for column in METADATA_COLUMNS:
            if column in self.schema.column_names:
                raise ReservedColumn(_name(table), column)
        self.identifier = [self.schema.find_column_name(field_id) for field_id in sorted(self.schema.identifier_field_ids)]

    def plan(self, files: SnapshotFiles) -> SnapshotChanges:
        """Find the carryover and the updates of one snapshot (the first pass)."""
        if files.rearranges_only:
            return SnapshotChanges(files)
        selections = [self.selection(part) for part in files.removed], [self.selection(part) for part in files.added]
        if not _rows(files.removed, selections[0]) or not _rows(files.added, selections[1]):
            return SnapshotChanges(files, removed_rows=selections[0], added_rows=selections[1])
        removed_rows, removed_docs = self._scan_keys(files.removed, selections[0])
        added_rows, added_docs = self._scan_keys(files.added, selections[1])
        counts = [frame.group_by(KEY).len() for frame in (removed_rows, added_rows)]
        carry = counts[0].join(counts[1], on=KEY).select(*KEY, carry=pl.min_horizontal("len", "len_right"))
        keep_removed, keep_added = _keep_beyond(removed_rows, counts[0], carry), _keep_beyond(added_rows, counts[1], carry)
        changes = SnapshotChanges(files, keep_removed, keep_added, removed_rows=selections[0], added_rows=selections[1])
        if self.identifier:
            both_removed, both_added = _in_both(removed_docs.filter(keep_removed), added_docs.filter(keep_added))
            changes.update_removed = np.zeros(len(keep_removed), dtype=bool)
            changes.update_removed[keep_removed] = both_removed
            changes.update_added = np.zeros(len(keep_added), dtype=bool)
            changes.update_added[keep_added] = both_added
        return changes

    def selection(self, part: Part) -> np.ndarray | None:
        """The positions of the part's rows in its data file, sorted (None: every row; the delete
        files are read, the data file is not)."""
        if part.whole:
            return None
        path = part.file.file_path
        without = deleted_positions(self.table.io, path, part.without)
        if part.only is not None:
            return np.setdiff1d(deleted_positions(self.table.io, path, part.only), without)
        return np.setdiff1d(np.arange(part.file.record_count, dtype=np.int64), without)

    def part_batches(self, part: Part, selection: np.ndarray | None) -> Iterator[pa.RecordBatch]:
        """The part's rows (`selection`: as `selection(part)` gives) in the current schema, batch by batch."""
        if selection is not None and not len(selection):
            return
        offset = 0
        for batch in file_batches(self.table, part.file, self.schema):
            size = batch.num_rows
            if selection is not None:
                low, high = np.searchsorted(selection, (offset, offset + size))
                if high - low < size:
                    batch = batch.take(pa.array(selection[low:high] - offset))
            offset += size
            if batch.num_rows:
                yield batch

    def _scan_keys(self, parts: tuple[Part, ...], selections: list[np.ndarray | None]) -> tuple[pl.DataFrame, pl.DataFrame]:
        rows, docs = [], []
        for part, selection in zip(parts, selections, strict=True):
            for batch in self.part_batches(part, selection):
                frame = _hashable(batch)
                rows.append(_keys(frame))
                if self.identifier:
                    docs.append(_keys(frame.select(self.identifier)))
        empty = pl.DataFrame(schema={"h1": pl.UInt64, "h2": pl.UInt64})
        return pl.concat(rows) if rows else empty, pl.concat(docs) if docs else empty

    def rows(self, changes: SnapshotChanges, skip: int = 0) -> Iterator[pa.RecordBatch]:
        """The snapshot's change rows in their stable order, from the `skip`-th on (second pass)."""
        if changes.files.rearranges_only:
            return
        if changes.spilled is not None:
            yield from self._spilled_rows(changes, skip)
            return
        sides = (
            (changes.files.removed, changes.removed_rows, changes.keep_removed, changes.update_removed, DELETE, UPDATE_BEFORE),
            (changes.files.added, changes.added_rows, changes.keep_added, changes.update_added, INSERT, UPDATE_AFTER),
        )
        for parts, selections, keep, update, plain, paired in sides:
            offset = 0
            for part, selection in zip(parts, selections or [None] * len(parts), strict=True):
                if keep is None and skip >= _part_rows(part, selection):
                    skip -= _part_rows(part, selection)  # skipped whole without reading it
                    continue
                for batch in self.part_batches(part, selection):
                    size = batch.num_rows
                    kept = keep[offset:offset + size] if keep is not None else None
                    updated = update[offset:offset + size] if update is not None else np.zeros(size, dtype=bool)
                    offset += size
                    if kept is not None:
                        batch, updated = batch.filter(pa.array(kept)), updated[kept]
                    if skip >= batch.num_rows:
                        skip -= batch.num_rows
                        continue
                    if skip:
                        batch, updated, skip = batch.slice(skip), updated[skip:], 0
                    types = pa.array(np.where(updated, paired, plain), type=pa.string())
                    yield self._labelled(batch, types, changes.files.snapshot)

    def _spilled_rows(self, changes: SnapshotChanges, skip: int) -> Iterator[pa.RecordBatch]:
        target = self.schema.as_arrow()
        for path in changes.spilled:
            store, location = locate(path, self.table.io)
            with store.open_input_file(location) as stream:
                batches = list(pq.ParquetFile(stream).iter_batches())
            for batch in batches:
                if skip >= batch.num_rows:
                    skip -= batch.num_rows
                    continue
                if skip:
                    batch, skip = batch.slice(skip), 0
                data = pa.Table.from_batches([batch.select(target.names)]).cast(target).combine_chunks().to_batches()[0]
                yield self._labelled(data, batch.column(CHANGE_TYPE).cast(pa.string()), changes.files.snapshot)

    def load(self, snapshot: Snapshot) -> list[Part]:
        """The data files of a full read of `snapshot`, each less its position deletes, in path
        order (equality delete files refused)."""
        data, deletes = live_files(self.table, snapshot.snapshot_id)
        applying = deletes_by_file(data, _refuse_equality_deletes(self.table, deletes))
        return [Part(data[path], None, tuple(applying.get(path, ()))) for path in sorted(data)]

    def file_rows(self, snapshot: Snapshot, part: Part, skip: int = 0) -> Iterator[pa.RecordBatch]:
        """One file's live rows as INSERTs of `snapshot` (an initial load), from the `skip`-th on."""
        for batch in self.part_batches(part, self.selection(part)):
            if skip >= batch.num_rows:
                skip -= batch.num_rows
                continue
            if skip:
                batch, skip = batch.slice(skip), 0
            yield self._labelled(batch, pa.array([INSERT] * batch.num_rows, type=pa.string()), snapshot)

    def _labelled(self, batch: pa.RecordBatch, types: pa.Array, snapshot: Snapshot) -> pa.RecordBatch:
        size = batch.num_rows
        committed = datetime.fromtimestamp(snapshot.timestamp_ms / 1000, tz=timezone.utc).isoformat().replace("+00:00", "Z")
        columns = [*batch.columns, types, pa.array([snapshot.snapshot_id] * size, type=pa.int64()), pa.array([committed] * size, type=pa.string())]
        names = [*batch.schema.names, CHANGE_TYPE, SNAPSHOT_ID, COMMITTED_AT]
        if self.identifier:
            parts = [pc.cast(batch.column(name), pa.string()) for name in self.identifier]
            columns.append(pc.binary_join_element_wise(*parts, DOCUMENT_ID_SEPARATOR))
            names.append(DOCUMENT_ID)
        return pa.RecordBatch.from_arrays(columns, names=names)
