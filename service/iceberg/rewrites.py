"""Committing a rewrite: files replaced by others in one snapshot, only while every file it
replaces is still live.

A rewrite is planned against the table as it was (a compaction picks small files; a Spark job
writes their rows into fewer files) and committed later, through the table's leader, after
whatever ingest committed meanwhile. Appends never touch the files a rewrite replaces, so they
commit freely around it; a rewrite or row change that replaced one of them first makes this one
stale, and it is refused (`FilesNotLive`), never committed over the newer state.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.table import Table, Transaction

from service.core.exceptions import FilesNotLive, RowsChanged
from service.iceberg import private
from service.iceberg.appends import data_file, ensure_name_mapping


@dataclass(frozen=True)
class Rewritten:
    files_removed: int
    files_added: int
    bytes_removed: int
    bytes_added: int
    rows: int


def live_data_files(table: Table) -> dict[str, DataFile]:
    """The data files of the table's current snapshot, by path."""
    snapshot = table.current_snapshot()
    if snapshot is None:
        return {}
    live: dict[str, DataFile] = {}
    for manifest in snapshot.manifests(table.io):
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if entry.data_file.content == DataFileContent.DATA:
                live[entry.data_file.file_path] = entry.data_file
    return live


def overwrite_files(
    table: Table, transaction: Transaction, removes: list[str], adds: list[str], snapshot_properties: dict[str, str],
) -> Rewritten:
    """Stage an `overwrite` snapshot in `transaction` (opened on `table`): row changes applied
    copy-on-write, `removes` out and `adds` in. A snapshot is made even when both are empty (every
    change was a no-op): it carries the watermark past the entries."""
    removed, added = _files(table, transaction, removes, adds)
    return _swap(transaction.update_snapshot(snapshot_properties=snapshot_properties).overwrite(), removed, added)


def replace_files(
    table: Table, transaction: Transaction, removes: list[str], adds: list[str], snapshot_properties: dict[str, str],
) -> Rewritten:
    """Stage a `replace` snapshot in `transaction` (opened on `table`): `adds` in, `removes` out,
    the same rows before and after."""
    removed, added = _files(table, transaction, removes, adds)
    rows_before = sum(file.record_count for file in removed)
    rows_after = sum(file.record_count for file in added)
    if rows_before != rows_after:
        raise RowsChanged(f"the rewrite holds {rows_after} rows where the files it replaces hold {rows_before}")
    return _swap(private.replace_producer(transaction, snapshot_properties), removed, added)


def _files(table: Table, transaction: Transaction, removes: list[str], adds: list[str]) -> tuple[list[DataFile], list[DataFile]]:
    """The live DataFiles to remove (FilesNotLive when one is gone) and the DataFiles to add."""
    live = live_data_files(table)
    gone = [path for path in removes if path not in live]
    if gone:
        raise FilesNotLive(f"{len(gone)} of the {len(removes)} files to replace are no longer in the table (first: {gone[0]})")
    ensure_name_mapping(transaction)
    return [live[path] for path in removes], [data_file(transaction, path) for path in adds]


def _swap(producer, removed: list[DataFile], added: list[DataFile]) -> Rewritten:  # noqa: ANN001 - a pyiceberg snapshot producer
    with producer as snapshot:
        for file in removed:
            snapshot.delete_data_file(file)
        for file in added:
            snapshot.append_data_file(file)
    return Rewritten(
        len(removed), len(added), sum(f.file_size_in_bytes for f in removed), sum(f.file_size_in_bytes for f in added),
        sum(f.record_count for f in added),
    )
