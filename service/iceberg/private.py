"""Every call Calve makes into pyiceberg's private API, each with the public API that would replace it.

pyiceberg 0.12 has no public way to build a DataFile for a bucket-partitioned table from a file's
values (`add_files` refuses non-linear transforms), so appends.py builds them itself with these;
and no public way to commit a `replace` snapshot (files swapped, rows unchanged), which
rewrites.py commits with `replace_producer`, nor to merge manifests outside a commit of files
(`merge_manifests_producer`, for upkeep.py); and no public way to stream one data file's rows
in the table's schema (`file_batches`, for changelog.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import ArrowScan, DataFileStatistics
from pyiceberg.manifest import DataFile
from pyiceberg.partitioning import PartitionField
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask, Table, Transaction
from pyiceberg.table.snapshots import Operation, Summary
from pyiceberg.table.update.snapshot import _MergeAppendFiles, _OverwriteFiles
from pyiceberg.typedef import EMPTY_DICT


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


class _ReplaceFiles(_AsReplace, _OverwriteFiles):
    """Its commit checks, as an overwrite's does, that every file it deletes is live in the parent."""


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
