"""Every call Calve makes into pyiceberg's private API, each with the public API that would replace it.

pyiceberg 0.12 has no public way to build a DataFile for a bucket-partitioned table from a file's
values (`add_files` refuses non-linear transforms), so appends.py builds them itself with these;
and no public way to commit a `replace` snapshot (files swapped, rows unchanged; delete files
folded in removed with their data files), which rewrites.py commits with `replace_producer`, nor to merge manifests outside a commit of files
(`merge_manifests_producer`, for upkeep.py); and no public way to stream one data file's rows
in the table's schema (`file_batches`, for changelog.py); and no way at all to commit position
delete files (`row_delta_producer`, for rewrites.py: merge-on-read row changes). The producers
`replace_producer` and `row_delta_producer` give merge their snapshot's small data manifests with pyiceberg's `_ManifestMergeManager`, as its merge
append does (public replacement: every snapshot producer honouring `commit.manifest-merge.*`, as
Java's merging producers do).

Three patches, not calls: `cache_transaction_metadata`, `share_updated_metadata` and
`cache_metadata_files` (applied when a catalog is opened).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import ArrowScan, DataFileStatistics
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriter,
    ManifestWriterV2,
)
from pyiceberg.partitioning import PartitionField
from pyiceberg.schema import Schema
from pyiceberg.serializers import FromInputFile, ToOutputFile
from pyiceberg.table import FileScanTask, Table, TableProperties, Transaction
from pyiceberg.table.snapshots import Operation, Summary
from pyiceberg.table.update.snapshot import _FastAppendFiles, _ManifestMergeManager, _MergeAppendFiles, _OverwriteFiles
from pyiceberg.typedef import EMPTY_DICT, KeyDefaultDict
from pyiceberg.utils.properties import property_as_bool, property_as_int

from service.iceberg.manifests import live_entries


def table_io(transaction: Transaction) -> FileIO:
    """The FileIO of the transaction's table. Public replacement: a `Transaction.io` property
    (today only `Table.io` is public, and a transaction keeps its table private)."""
    return transaction._table.io  # noqa: SLF001


def partition_value(statistics: DataFileStatistics, field: PartitionField, schema: Schema) -> Any:
    """A file's value of an order-preserving partition field, from its column statistics: what
    `add_files` does per file. Public replacement: `add_files` accepting every transform, or a
    public `DataFileStatistics.partition`."""
    return statistics._partition_value(field, schema)  # noqa: SLF001


def file_batches(table: Table, data_file: DataFile, schema: Schema) -> Iterator[pa.RecordBatch]:
    """One data file's rows in `schema` (columns matched by field id: added columns read as null,
    renamed ones under their new name), batch by batch. Public replacement: `ArrowScan.
    to_record_batches`, which reads every task of a list at once and holds each file whole."""
    scan = ArrowScan(table.metadata, table.io, schema, AlwaysTrue())
    return scan._record_batches_from_scan_tasks_and_deletes([FileScanTask(data_file)], {})  # noqa: SLF001


class _DeleteManifestWriter(ManifestWriterV2):
    """A v2 manifest of delete files (pyiceberg's writers write data manifests only)."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


class _AddsDeleteFiles:
    """A producer that also adds position delete files, in delete manifests of their own (one per
    partition spec; pyiceberg's producers write data manifests only)."""

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self._added_delete_files: list[DataFile] = []

    def append_delete_file(self, delete_file: DataFile) -> _AddsDeleteFiles:
        self._added_delete_files.append(delete_file)
        return self

    def _manifests(self) -> list[ManifestFile]:
        manifests = super()._manifests()  # type: ignore[misc]
        by_spec: dict[int, list[DataFile]] = {}
        for delete_file in self._added_delete_files:
            by_spec.setdefault(delete_file.spec_id, []).append(delete_file)
        for spec_id, files in by_spec.items():
            writer = _DeleteManifestWriter(self.spec(spec_id), self.schema(), self.new_manifest_output(), self._snapshot_id, self._compression)  # type: ignore[attr-defined]
            with writer:
                for delete_file in files:
                    writer.add(ManifestEntry.from_args(
                        status=ManifestEntryStatus.ADDED, snapshot_id=self._snapshot_id, sequence_number=None,  # type: ignore[attr-defined]
                        file_sequence_number=None, data_file=delete_file,
                    ))
            manifests.append(writer.to_manifest_file())
        return manifests

    def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
        # The summary collector counts delete files by their content (added-position-deletes...).
        added = self._added_data_files  # type: ignore[has-type]
        self._added_data_files = [*added, *self._added_delete_files]
        try:
            return super()._summary(snapshot_properties)  # type: ignore[misc]
        finally:
            self._added_data_files = added


class _MergesDataManifests:
    """A producer that merges the snapshot's small data manifests as a merge append does, by the
    table's `commit.manifest-merge.*` properties (pyiceberg's fast append and overwrite never do):
    a table taking a run of row changes a second would otherwise gain a data manifest per run,
    and every reader pays about a millisecond to plan each (pyiceberg, here)."""

    merges_all = False  # every data manifest it can, whatever the table's min-count-to-merge

    def _process_manifests(self, manifests: list[ManifestFile]) -> list[ManifestFile]:
        manifests = super()._process_manifests(manifests)  # type: ignore[misc]
        properties = self._transaction.table_metadata.properties  # type: ignore[attr-defined]
        merger = _ManifestMergeManager(
            property_as_int(properties, TableProperties.MANIFEST_TARGET_SIZE_BYTES, TableProperties.MANIFEST_TARGET_SIZE_BYTES_DEFAULT),  # type: ignore[arg-type]
            2 if self.merges_all else property_as_int(  # type: ignore[arg-type]
                properties, TableProperties.MANIFEST_MIN_MERGE_COUNT, TableProperties.MANIFEST_MIN_MERGE_COUNT_DEFAULT,
            ),
            self.merges_all or property_as_bool(properties, TableProperties.MANIFEST_MERGE_ENABLED, TableProperties.MANIFEST_MERGE_ENABLED_DEFAULT),
            self,  # type: ignore[arg-type]
        )
        data = [manifest for manifest in manifests if manifest.content == ManifestContent.DATA]
        return merger.merge_manifests(data) + [manifest for manifest in manifests if manifest.content != ManifestContent.DATA]


class _AsReplace:
    """A producer whose snapshot says `replace`: files or manifests swapped, rows unchanged."""

    def _summary(self, snapshot_properties: dict[str, str] = EMPTY_DICT) -> Summary:
        # pyiceberg's summary arithmetic knows append, overwrite and delete only; a replace adds
        # and removes files exactly as an overwrite does.
        self._operation = Operation.OVERWRITE
        try:
            summary = super()._summary(snapshot_properties)  # type: ignore[misc]
        finally:
            self._operation = Operation.REPLACE
        return Summary(operation=Operation.REPLACE, **summary.additional_properties)


class _RemovesDeleteFiles(_MergesDataManifests, _AddsDeleteFiles, _OverwriteFiles):
    """An overwrite that removes delete files as well as data files, and adds both. Its commit
    checks, as an overwrite's does, that every file it removes is live in the parent.

    pyiceberg's overwrite finds data files only, and rewrites a manifest it removes some files from
    with a data manifest writer, which would turn the delete files a delete manifest keeps into
    data files. And it reads every manifest of the partitions it touches; this one reads and
    rewrites only the manifests that hold a file it removes (manifests.live_entries knows which).
    And it carries on manifests whose entries are all deleted ones (the manifest of what the
    parent removed); this one leaves them out, as a fast append does, so a row delta that removes
    delete files every run does not leave one such manifest per run behind for every reader."""

    _removed_delete_entries: list[ManifestEntry]

    def _holds_removed(self, manifest: ManifestFile) -> bool:
        removed = {file.file_path for file in self._deleted_data_files}  # a few files; asked once per manifest
        return any(file.file_path in removed for file in live_entries(manifest, self._io))

    def _deleted_entries(self) -> list[ManifestEntry]:
        entries: list[ManifestEntry] = []
        parent = self._transaction.table_metadata.snapshot_by_id(self._parent_snapshot_id) if self._parent_snapshot_id is not None else None
        evaluators: dict[int, Callable[[ManifestFile], bool]] = KeyDefaultDict(self._build_manifest_evaluator)
        for manifest in parent.manifests(self._io) if parent is not None else []:
            if not evaluators[manifest.partition_spec_id](manifest) or not self._holds_removed(manifest):
                continue
            entries += [
                ManifestEntry.from_args(
                    status=ManifestEntryStatus.DELETED, snapshot_id=self._snapshot_id, sequence_number=entry.sequence_number,
                    file_sequence_number=entry.file_sequence_number, data_file=entry.data_file,
                )
                for entry in manifest.fetch_manifest_entry(self._io, discard_deleted=True)
                if entry.data_file in self._deleted_data_files
            ]
        self._validate_required_deletes(entries)
        self._removed_delete_entries = [entry for entry in entries if entry.data_file.content != DataFileContent.DATA]
        return [entry for entry in entries if entry.data_file.content == DataFileContent.DATA]

    def _existing_manifests(self) -> list[ManifestFile]:
        kept: list[ManifestFile] = []
        evaluators: dict[int, Callable[[ManifestFile], bool]] = KeyDefaultDict(self._build_manifest_evaluator)
        snapshot = self._transaction.table_metadata.snapshot_by_name(name=self._target_branch)
        for manifest in snapshot.manifests(io=self._io) if snapshot is not None else []:
            if not manifest.has_added_files() and not manifest.has_existing_files():
                continue  # its entries are all deleted ones, of the snapshot that deleted them: not carried on (as a fast append does)
            if not evaluators[manifest.partition_spec_id](manifest) or not self._holds_removed(manifest):
                kept.append(manifest)
                continue
            entries = manifest.fetch_manifest_entry(io=self._io, discard_deleted=True)
            survivors = [entry for entry in entries if entry.data_file not in self._deleted_data_files]
            if len(survivors) == len(entries):
                kept.append(manifest)
            elif survivors:
                with self._writer(manifest.content, manifest.partition_spec_id) as writer:
                    for entry in survivors:
                        writer.add_entry(ManifestEntry.from_args(
                            status=ManifestEntryStatus.EXISTING, snapshot_id=entry.snapshot_id, sequence_number=entry.sequence_number,
                            file_sequence_number=entry.file_sequence_number, data_file=entry.data_file,
                        ))
                kept.append(writer.to_manifest_file())
        return kept

    def _process_manifests(self, manifests: list[ManifestFile]) -> list[ManifestFile]:
        by_spec: dict[int, list[ManifestEntry]] = {}
        for entry in self._removed_delete_entries:
            by_spec.setdefault(entry.data_file.spec_id, []).append(entry)
        for spec_id, entries in by_spec.items():
            with self._writer(ManifestContent.DELETES, spec_id) as writer:
                for entry in entries:
                    writer.add_entry(entry)
            manifests = [*manifests, writer.to_manifest_file()]
        return super()._process_manifests(manifests)

    def _writer(self, content: ManifestContent, spec_id: int) -> ManifestWriter:
        if content == ManifestContent.DELETES:
            return _DeleteManifestWriter(self.spec(spec_id), self.schema(), self.new_manifest_output(), self._snapshot_id, self._compression)
        return self.new_manifest_writer(self.spec(spec_id))


class _ReplaceFiles(_AsReplace, _RemovesDeleteFiles):
    """A compaction's snapshot: it folds a data file's position deletes into the file that
    replaces it (removing both), drops delete files whose data file is gone, and adds delete
    files: rows of the files it rewrites deleted since it was planned, carried over to the files
    that replace them (folding.py). It merges every data manifest it can, as a manifest merge
    does: a compacted table should be planned as one that never took a change (a few small
    manifests cost a reader about a millisecond each, and a compaction is rare)."""

    merges_all = True


class _MergeManifests(_AsReplace, _MergeAppendFiles):
    """A merge append of no files that merges every manifest it can (not only past the table's
    min-count-to-merge)."""

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self._merge_enabled = True
        self._min_count_to_merge = 2


def replace_producer(transaction: Transaction, snapshot_properties: dict[str, str]) -> _OverwriteFiles:
    """A producer of one `replace` snapshot in `transaction`. Public replacement: a
    `UpdateSnapshot.replace()` (pyiceberg has `overwrite()`, `delete()` and the appends)."""
    return _ReplaceFiles(
        operation=Operation.REPLACE, transaction=transaction, io=table_io(transaction), snapshot_properties=snapshot_properties,
    )


def merge_manifests_producer(transaction: Transaction, snapshot_properties: dict[str, str]) -> _MergeAppendFiles:
    """A producer of one `replace` snapshot that only merges the table's manifests. Public
    replacement: `rewrite_manifests()` (pyiceberg 0.12 has none)."""
    return _MergeManifests(
        operation=Operation.REPLACE, transaction=transaction, io=table_io(transaction), snapshot_properties=snapshot_properties,
    )


class _RowDelta(_MergesDataManifests, _AddsDeleteFiles, _FastAppendFiles):
    """A fast append of data files that also adds position delete files. The snapshot says
    `overwrite`, as Iceberg's RowDelta does when it adds rows and deletes some."""


class _RowDeltaReplacingDeletes(_RemovesDeleteFiles):
    """A row delta that also removes the delete files its own delete files replace."""


def row_delta_producer(
    transaction: Transaction, snapshot_properties: dict[str, str], removes_deletes: bool = False,
) -> _FastAppendFiles | _OverwriteFiles:
    """A producer of one `overwrite` snapshot adding data files and position delete files (and,
    with `removes_deletes`, removing delete files: `delete_data_file`). Public replacement:
    pyiceberg's open work on merge-on-read writes (a `RowDelta`-like `UpdateSnapshot` producer
    with `removeDeletes`, or v3 deletion vectors written by `Transaction.delete`)."""
    producer = _RowDeltaReplacingDeletes if removes_deletes else _RowDelta
    return producer(operation=Operation.OVERWRITE, transaction=transaction, io=table_io(transaction), snapshot_properties=snapshot_properties)


def cache_transaction_metadata() -> None:
    """Make `Transaction.table_metadata` compute once per state of the transaction.

    In pyiceberg 0.12 each read of that property replays the staged updates onto the table's
    metadata and deep-copies the result, snapshots and metadata log included, and one append
    reads it several times: profiled under `make bench` with a commit every ~0.4 s, half of the
    committer's CPU went to those copies, more the longer the table's history. The result is
    kept with the two inputs it came from (the table's metadata and the tuple of staged updates,
    both replaced, never changed in place, when a commit lands or an update is staged), so a read
    of an unchanged transaction returns it again. TableMetadata is a frozen model and pyiceberg
    does not change it in place. Public replacement: the same cache in pyiceberg itself
    (apache/iceberg-python#3302, carried on as #3784); drop this once the pinned release has it.
    """
    original = Transaction.table_metadata
    if getattr(original.fget, "calve_cached", False):
        return

    def table_metadata(transaction: Transaction) -> Any:
        kept = transaction.__dict__.get("_calve_metadata")
        if kept is not None and kept[0] is transaction._table.metadata and kept[1] is transaction._updates:  # noqa: SLF001
            return kept[2]
        metadata = original.fget(transaction)
        transaction.__dict__["_calve_metadata"] = (transaction._table.metadata, transaction._updates, metadata)  # noqa: SLF001
        return metadata

    table_metadata.calve_cached = True  # type: ignore[attr-defined]
    Transaction.table_metadata = property(table_metadata)  # type: ignore[method-assign]


def share_updated_metadata() -> None:
    """Make pyiceberg's `update_table_metadata` return the updated metadata without deep-copying it.

    pyiceberg 0.12 applies a commit's updates by copy on write (each update makes a new
    TableMetadata with new lists and dicts for what it changes: `model_copy(update=...)`) and
    then deep-copies the result, every snapshot, log entry, schema and spec of the table's
    history, in case something changes it in place later (apache/iceberg-python#182: "might be
    inadvertently altered"). Nothing does: TableMetadata is frozen, every update builds new
    containers, and Calve never changes one in place. A commit ran it twice (the transaction's
    view, then the catalog's update), and under `make bench`'s OTLP load those copies were 38% of
    the committer's CPU samples, more the longer a table's history. This is that function with
    the last copy left out (`enforce_validation`, which parses the result afresh, as before).
    Public replacement: none in pyiceberg 0.12; drop this when its update_table_metadata stops
    copying (or when the cache in apache/iceberg-python#3784 makes it rare enough).
    """
    import pyiceberg.catalog
    import pyiceberg.table
    import pyiceberg.table.update as module
    from pyiceberg.table.metadata import TableMetadataUtil

    original = module.update_table_metadata
    if getattr(original, "calve_shared", False):
        return

    def update_table_metadata(base_metadata: Any, updates: tuple, enforce_validation: bool = False, metadata_location: str | None = None) -> Any:
        context = module._TableMetadataUpdateContext()  # noqa: SLF001
        metadata = base_metadata
        for update in updates:
            metadata = module._apply_table_update(update, metadata, context)  # noqa: SLF001
        if context.has_changes():
            if metadata_location:
                metadata = module._update_table_metadata_log(metadata, metadata_location, base_metadata.last_updated_ms)  # noqa: SLF001
            if base_metadata.last_updated_ms == metadata.last_updated_ms:
                metadata = metadata.model_copy(update={"last_updated_ms": module.datetime_to_millis(module.datetime.now().astimezone())})
        metadata.spec().check_compatible(metadata.schema())
        metadata.sort_order().check_compatible(metadata.schema())
        if enforce_validation:
            return TableMetadataUtil.parse_obj(metadata.model_dump())
        return metadata

    update_table_metadata.calve_shared = True  # type: ignore[attr-defined]
    for holder in (module, pyiceberg.table, pyiceberg.catalog):  # each imported it by name
        if getattr(holder, "update_table_metadata", None) is original:
            holder.update_table_metadata = update_table_metadata  # type: ignore[attr-defined]


METADATA_FILES_KEPT = 8  # parsed table metadata files a process keeps, the last used first


def cache_metadata_files() -> None:
    """Parse each table metadata file once per process, not at every load of its table.

    A SQL catalog's load_table reads and parses the table's current metadata JSON each time:
    profiled under `make bench-upsert`, 12% of the committer's CPU and 13-14% of the writers' went
    to it (the table keeps up to CALVE_SNAPSHOT_MAX_COUNT snapshots and as many metadata-log
    entries), though the file rarely changed between two loads by one process. An Iceberg
    metadata file is never rewritten (each commit writes a new one, named by a counter and a
    UUID), so its parse is kept by its location, METADATA_FILES_KEPT of them; a file this process
    writes is kept as written, which is the object pyiceberg itself keeps as the table's metadata
    after the commit. TableMetadata is a frozen model and pyiceberg replaces it, never changes it
    in place, so one object serves every load. A catalog answering with metadata (REST) parses
    no file and is not affected. Public replacement: none in pyiceberg 0.12 (Java's catalogs keep
    a table cache, CachingCatalog, the closest); drop this if pyiceberg caches parsed metadata.
    """
    if getattr(FromInputFile.table_metadata, "calve_cached", False):
        return
    read, write = FromInputFile.table_metadata, ToOutputFile.table_metadata
    kept: OrderedDict[str, Any] = OrderedDict()
    lock = threading.Lock()

    def keep(location: str, metadata: Any) -> None:
        with lock:
            kept[location] = metadata
            kept.move_to_end(location)
            while len(kept) > METADATA_FILES_KEPT:
                kept.popitem(last=False)

    def cached_read(input_file: Any, *args: Any, **kwargs: Any) -> Any:
        with lock:
            metadata = kept.get(input_file.location)
            if metadata is not None:
                kept.move_to_end(input_file.location)
                return metadata
        metadata = read(input_file, *args, **kwargs)
        keep(input_file.location, metadata)
        return metadata

    def kept_write(metadata: Any, output_file: Any, *args: Any, **kwargs: Any) -> None:
        write(metadata, output_file, *args, **kwargs)
        keep(output_file.location, metadata)

    cached_read.calve_cached = True  # type: ignore[attr-defined]
    FromInputFile.table_metadata = staticmethod(cached_read)  # type: ignore[method-assign]
    ToOutputFile.table_metadata = staticmethod(kept_write)  # type: ignore[method-assign]
