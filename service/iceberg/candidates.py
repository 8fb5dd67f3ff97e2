"""The files row changes must look in: the data files of a snapshot that may hold one of a set of
keys, each with the position delete files that apply to it.

pyiceberg's planner cannot do this at the scale of a change stream: an `In` of more than 200
values is not checked against the files' statistics at all (every file of the table becomes a
candidate), and each plan reads every manifest again. Here the changed keys are sorted once and
each data file's bounds for the identifier columns are looked up in them (a file is left out when,
for some identifier column, no changed key lies between its lower and upper bound), and the
entries of each manifest are read once per process (manifests.py).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Any

import pyarrow as pa
from pyiceberg.conversions import from_bytes
from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.table import Table
from pyiceberg.types import DoubleType, FloatType, PrimitiveType

from service.iceberg.rewrites import deletes_by_file, live_files


def candidate_files(table: Table, snapshot_id: int, keys: list[str], changed: pa.Table) -> list[tuple[str, list[str]]]:
    """(data file, its position delete files) for every data file of the snapshot that may hold a
    row whose identifier columns `keys` equal one of `changed`'s rows, by path. A file whose
    bounds cannot be read or compared is a candidate: this only ever leaves out files that
    cannot match. ValueError for a snapshot with equality deletes (Calve never writes them)."""
    data, deletes = live_files(table, snapshot_id)
    if any(delete.content == DataFileContent.EQUALITY_DELETES for delete in deletes):
        raise ValueError("the table has equality delete files, which Calve cannot apply")
    schema = table.schema()
    columns = []
    for key in keys:
        field = schema.find_field(key)
        values = sorted({value for value in _internal(changed.column(key)).to_pylist() if value is not None})
        columns.append((field.field_id, field.field_type, values))
    held = {path: file for path, file in data.items() if all(_may_hold(file, *column) for column in columns)}
    applying = deletes_by_file(held, deletes)
    return sorted((path, [file.file_path for file in applying.get(path, [])]) for path in held)


def _may_hold(file: DataFile, field_id: int, field_type: Any, values: list) -> bool:
    """Whether a changed value lies within the file's bounds for the column (True when unknown)."""
    if not values:
        return False  # no changed key has a value here: no row of this file can match
    lower, upper = (file.lower_bounds or {}).get(field_id), (file.upper_bounds or {}).get(field_id)
    if lower is None or upper is None or not isinstance(field_type, PrimitiveType) or isinstance(field_type, (FloatType, DoubleType)):
        return True
    try:
        return bisect_left(values, from_bytes(field_type, lower)) < bisect_right(values, from_bytes(field_type, upper))
    except Exception:  # noqa: BLE001 - bounds of another width or kind than the column's now: keep the file
        return True


def _internal(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """Values as Iceberg's bounds read (pyiceberg's from_bytes): timestamps and times as
    microseconds, dates as days; strings compare by code point in both."""
    kind = column.type
    if pa.types.is_timestamp(kind):
        return column.cast(pa.timestamp("us", kind.tz)).cast(pa.int64())
    if pa.types.is_time(kind):
        return column.cast(pa.time64("us")).cast(pa.int64())
    if pa.types.is_date(kind):
        return column.cast(pa.date32()).cast(pa.int32())
    return column
