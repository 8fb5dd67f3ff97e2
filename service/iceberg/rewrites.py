"""Committing a rewrite: files replaced by others in one snapshot, only while every file it
replaces is still live and has no rows deleted since it was planned; and row changes, copy-on-write
(an overwrite) or merge-on-read (data files and position delete files: a row delta).

A rewrite is planned against the table as it was (a compaction picks small files; a Spark job
writes their rows into fewer files) and committed later, through the table's leader, after
whatever ingest committed meanwhile. Appends never touch the files a rewrite replaces, so they
commit freely around it; a rewrite or row change that replaced one of them first, or deleted rows
of one (merge-on-read), makes this one stale, and it is refused (`FilesNotLive`), never committed
over the newer state.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table import Table, Transaction
from pyiceberg.table.delete_file_index import PATH_FIELD_ID

from service.core.exceptions import FilesNotLive, RowsChanged
from service.iceberg import private
from service.iceberg.appends import data_file, ensure_name_mapping
from service.iceberg.folding import carry_over, read_layouts
from service.iceberg.manifests import live_entries
from spark_jobs.contract import new_directory


@dataclass(frozen=True)
class Rewritten:
    files_removed: int
    files_added: int
    bytes_removed: int
    bytes_added: int
    rows: int
    delete_files_removed: int = 0


# Iceberg's table properties for how row changes are written (Spark's Iceberg writer reads the same).
WRITE_MODE_PROPERTIES = ("write.delete.mode", "write.update.mode", "write.merge.mode")
MERGE_ON_READ = "merge-on-read"
COPY_ON_WRITE = "copy-on-write"


def merge_on_read(table: Table) -> bool:
    """Whether the table's row changes are written merge-on-read (Iceberg's default, and Calve's
    for a table without the property, is copy-on-write); v1 tables have no delete files."""
    return table.properties.get("write.update.mode") == MERGE_ON_READ and table.metadata.format_version >= 2


def live_data_files(table: Table) -> dict[str, DataFile]:
    """The data files of the table's current snapshot, by path."""
    return live_files(table)[0]


def live_files(table: Table, snapshot_id: int | None = None) -> tuple[dict[str, DataFile], list[DataFile]]:
    """The data files of the table's current snapshot (or `snapshot_id`), by path, and its delete
    files. ValueError for a snapshot the table no longer has."""
    snapshot = table.current_snapshot() if snapshot_id is None else table.snapshot_by_id(snapshot_id)
    if snapshot is None:
        if snapshot_id is not None:
            raise ValueError(f"snapshot {snapshot_id} is not in the table")
        return {}, []
    live: dict[str, DataFile] = {}
    deletes: list[DataFile] = []
    for manifest in snapshot.manifests(table.io):
        for file in live_entries(manifest, table.io):
            if file.content == DataFileContent.DATA:
                live[file.file_path] = file
            else:
                deletes.append(file)
    return live, deletes


def deletes_by_file(data: dict[str, DataFile], deletes: list[DataFile]) -> dict[str, list[DataFile]]:
    """For each data file some delete file may apply to, those delete files (by path): the one
    its file_path bounds name, or, for a delete file without such bounds (another engine's, an
    equality delete), every file of its partition."""
    named: dict[str, list[DataFile]] = {}
    by_partition: dict[tuple, list[DataFile]] = {}
    for delete in deletes:
        referenced = referenced_data_file(delete)
        if referenced is None:
            by_partition.setdefault((delete.spec_id, delete.partition), []).append(delete)
        else:
            named.setdefault(referenced, []).append(delete)
    applying = {path: [*named.get(path, []), *by_partition.get((file.spec_id, file.partition), [])] for path, file in data.items()}
    return {path: sorted(files, key=lambda file: file.file_path) for path, files in applying.items() if files}


def referenced_data_file(delete: DataFile) -> str | None:
    """The one data file a position delete file applies to, when its bounds say so."""
    if delete.content != DataFileContent.POSITION_DELETES:
        return None
    lower, upper = (delete.lower_bounds or {}).get(PATH_FIELD_ID), (delete.upper_bounds or {}).get(PATH_FIELD_ID)
    return lower.decode() if lower is not None and lower == upper else None


def overwrite_files(
    table: Table, transaction: Transaction, removes: list[str], adds: list[str], snapshot_properties: dict[str, str],
) -> Rewritten:
    """Stage an `overwrite` snapshot in `transaction` (opened on `table`): row changes applied
    copy-on-write, `removes` out and `adds` in. A snapshot is made even when both are empty (every
    change was a no-op): it carries the watermark past the entries."""
    # The rows of files with deletes were read without the deleted ones, against this very snapshot.
    removed, added = _files(table, transaction, removes, adds)
    return _swap(transaction.update_snapshot(snapshot_properties=snapshot_properties).overwrite(), removed, added)


def row_delta(
    table: Table, transaction: Transaction, adds: list[str], deletes: list[list], snapshot_properties: dict[str, str],
) -> Rewritten:
    """Stage a merge-on-read snapshot in `transaction` (opened on `table`): `adds` (new rows) in,
    and `deletes`, position delete files ([path, the data file it applies to, rows, bytes, and
    optionally the delete files of that data file it replaces]), each in its data file's partition
    with file_path bounds naming that file only; the delete files they replace out. FilesNotLive
    when a data file they apply to, or a delete file they replace, is gone."""
    live, live_deletes = live_files(table)
    gone = [data for _path, data, *_rest in deletes if data not in live]
    if gone:
        raise FilesNotLive(f"{len(gone)} of the {len(deletes)} files rows were deleted from are no longer in the table (first: {gone[0]})")
    by_path = {file.file_path: file for file in live_deletes}
    replaced = [path for _path, _data, _rows, _bytes, *rest in deletes for path in (rest[0] if rest else [])]
    if missing := [path for path in replaced if path not in by_path]:
        raise FilesNotLive(f"{len(missing)} of the delete files {len(deletes)} new ones replace are no longer in the table (first: {missing[0]})")
    ensure_name_mapping(transaction)
    added = [data_file(transaction, path) for path in adds]
    delete_files = [position_delete_file(path, live[data], rows, size, live[data].spec_id) for path, data, rows, size, *_rest in deletes]
    with private.row_delta_producer(transaction, snapshot_properties, removes_deletes=bool(replaced)) as snapshot:
        for path in replaced:
            snapshot.delete_data_file(by_path[path])
        for file in added:
            snapshot.append_data_file(file)
        for file in delete_files:
            snapshot.append_delete_file(file)
    return Rewritten(0, len(added) + len(delete_files), 0, sum(f.file_size_in_bytes for f in [*added, *delete_files]),
                     sum(f.record_count for f in added), len(replaced))


def position_delete_file(path: str, data: DataFile, rows: int, size: int, spec_id: int) -> DataFile:
    """The DataFile of a position delete file at `path` deleting `rows` of `data` alone: in its
    partition, with file_path bounds naming it, so readers skip it for every other file."""
    delete = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES, file_path=path, file_format=FileFormat.PARQUET, partition=data.partition,
        record_count=rows, file_size_in_bytes=size, sort_order_id=None, equality_ids=None, key_metadata=None,
        lower_bounds={PATH_FIELD_ID: data.file_path.encode()}, upper_bounds={PATH_FIELD_ID: data.file_path.encode()},
    )
    delete.spec_id = spec_id  # not one of from_args' fields (nor is it set on a DataFile not read from a manifest)
    return delete


def replace_files(
    table: Table, transaction: Transaction, removes: list[str], adds: list[str], snapshot_properties: dict[str, str],
    folded: dict[str, list[str]] | None = None,
) -> Rewritten:
    """Stage a `replace` snapshot in `transaction` (opened on `table`): `adds` in, `removes` out,
    the same rows before and after, less those the position delete files `folded` (per removed
    file, the delete files its rewrite applied) deleted: those delete files go too, as do delete
    files whose data file is gone. Rows of a removed file deleted since the rewrite was planned
    (delete files not among those folded) are deleted from its copy by delete files written here
    from the copies' layouts (also when a row change replaced a file's folded delete files with
    one holding their rows and its own). FilesNotLive when a file to remove is gone, or its newer
    deletes cannot be carried over."""
    folded = folded or {}
    live, deletes = live_files(table)
    gone = [path for path in removes if path not in live]
    if gone:
        raise FilesNotLive(f"{len(gone)} of the {len(removes)} files to replace are no longer in the table (first: {gone[0]})")
    applying = deletes_by_file({path: live[path] for path in removes}, deletes)
    newer: dict[str, list[DataFile]] = {}  # per file, delete files committed since the rewrite was planned
    # Files whose folded delete files a row change replaced since (row_delta_job.py keeps one
    # delete file per data file, holding the rows of those it replaces): every delete file they
    # have now is newer; what the copy already left out is not deleted from it twice (folding.py).
    merged = set()
    for path in removes:
        now = applying.get(path, [])
        if set(folded.get(path, [])) <= {file.file_path for file in now}:
            added = [file for file in now if file.file_path not in folded.get(path, [])]
        else:
            added = now
            merged.add(path)
        if added:
            newer[path] = added
    removed_deletes = [file for path in removes for file in applying.get(path, [])]
    if any(referenced_data_file(file) is None for file in removed_deletes):  # the planner folds file-bounded deletes only
        raise FilesNotLive("a delete file that applies to a file to replace may apply to other files of its partition")
    # Delete files whose data file is gone (replaced copy-on-write, say): they delete nothing.
    removed_deletes += [file for file in deletes if (named := referenced_data_file(file)) is not None and named not in live]
    ensure_name_mapping(transaction)
    removed, added = [live[path] for path in removes], [data_file(transaction, path) for path in adds]
    # The rows the folded delete files delete; of a merged file, the rows its copy left out.
    layouts = read_layouts(table.io, adds) if merged else {}  # read once: the carry-over below needs them too
    folded_rows = sum(file.record_count for path in removes if path not in merged
                      for file in applying.get(path, []) if file.file_path in folded.get(path, []))
    folded_rows += sum(len(layouts[path][3]) if path in layouts else 0 for path in merged)
    rows_before = sum(file.record_count for file in removed) - folded_rows
    rows_after = sum(file.record_count for file in added)
    if rows_before != rows_after:
        raise RowsChanged(f"the rewrite holds {rows_after} rows where the files it replaces hold {rows_before} (deleted rows not counted)")
    # Rows deleted since it was planned are deleted from the copies too (folding.py).
    by_path = {file.file_path: file for file in added}
    carried = [
        position_delete_file(path, by_path[copy], rows, size, transaction.table_metadata.default_spec_id)
        for path, copy, rows, size in carry_over(table.io, new_directory(table.location(), "carried"), newer, layouts or read_layouts(table.io, adds))
    ] if newer else []
    producer = private.replace_producer(transaction, snapshot_properties)
    for file in carried:
        producer.append_delete_file(file)
    return _swap(producer, removed, added, removed_deletes)


def _files(table: Table, transaction: Transaction, removes: list[str], adds: list[str]) -> tuple[list[DataFile], list[DataFile]]:
    """The live DataFiles to remove (FilesNotLive when one is gone) and the DataFiles to add."""
    live = live_data_files(table)
    gone = [path for path in removes if path not in live]
    if gone:
        raise FilesNotLive(f"{len(gone)} of the {len(removes)} files to replace are no longer in the table (first: {gone[0]})")
    ensure_name_mapping(transaction)
    return [live[path] for path in removes], [data_file(transaction, path) for path in adds]


def _swap(producer, removed: list[DataFile], added: list[DataFile], removed_deletes: list[DataFile] = ()) -> Rewritten:  # noqa: ANN001 - a pyiceberg snapshot producer
    with producer as snapshot:
        for file in [*removed, *removed_deletes]:
            snapshot.delete_data_file(file)
        for file in added:
            snapshot.append_data_file(file)
    return Rewritten(
        len(removed), len(added), sum(f.file_size_in_bytes for f in removed), sum(f.file_size_in_bytes for f in added),
        sum(f.record_count for f in added), len(removed_deletes),
    )
