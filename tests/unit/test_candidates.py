"""Which files row changes look in (service/iceberg/candidates.py), on real Iceberg tables: files
whose identifier bounds hold no changed key are left out, every file that may hold one is kept,
with the position delete files that apply to it."""

from __future__ import annotations

import datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table.delete_file_index import PATH_FIELD_ID

from service.iceberg import private
from service.iceberg.candidates import candidate_files
from tests.unit.tables import START, three_files


@pytest.fixture
def table(tmp_path: Path):  # noqa: ANN201
    return three_files(tmp_path)


def files_holding(table, snapshot_id: int, keys: list[str], changed: pa.Table) -> list[int]:  # noqa: ANN001
    """Which of the three files (by the first id they hold) are candidates."""
    paths = {path: index for index, path in enumerate(sorted_paths(table, snapshot_id))}
    return sorted(paths[path] * 100 for path, _deletes in candidate_files(table, snapshot_id, keys, changed))


def sorted_paths(table, snapshot_id: int) -> list[str]:  # noqa: ANN001
    """The data files, ordered by the ids they hold."""
    tasks = table.scan(snapshot_id=snapshot_id).plan_files()
    return [task.file.file_path for task in sorted(tasks, key=lambda task: pq.read_table(task.file.file_path, columns=["id"])["id"][0].as_py())]


def test_only_files_whose_bounds_hold_a_changed_key_are_candidates(table) -> None:  # noqa: ANN001
    snapshot = table.current_snapshot().snapshot_id
    assert files_holding(table, snapshot, ["id"], pa.table({"id": pa.array([150, 250, 999], pa.int64())})) == [100, 200]
    assert files_holding(table, snapshot, ["id"], pa.table({"id": pa.array([42], pa.int64())})) == [0]
    assert files_holding(table, snapshot, ["id"], pa.table({"id": pa.array([5000], pa.int64())})) == []
    # More keys than pyiceberg's planner checks against bounds (200): still pruned.
    assert files_holding(table, snapshot, ["id"], pa.table({"id": pa.array(range(1000, 2000), pa.int64())})) == []
    # An older snapshot is planned as it was: two files.
    first = table.snapshots()[1].snapshot_id
    assert files_holding(table, first, ["id"], pa.table({"id": pa.array([150, 250], pa.int64())})) == [100]


def test_timestamps_and_composite_keys_are_compared_as_the_bounds_hold_them(table) -> None:  # noqa: ANN001
    snapshot = table.current_snapshot().snapshot_id
    late = START + datetime.timedelta(minutes=250 * 0.6)
    changed = pa.table({"ts": pa.array([late], pa.timestamp("us", "UTC"))})
    assert files_holding(table, snapshot, ["ts"], changed) == [200]
    # Each column must have a changed value within the file's bounds: id 50 is in the first file
    # but its time is not.
    both = pa.table({"id": pa.array([50], pa.int64()), "ts": pa.array([late], pa.timestamp("us", "UTC"))})
    assert files_holding(table, snapshot, ["id", "ts"], both) == []


def test_a_candidate_comes_with_the_position_delete_files_that_apply_to_it(table, tmp_path: Path) -> None:  # noqa: ANN001
    paths = sorted_paths(table, table.current_snapshot().snapshot_id)
    delete_path = str(tmp_path / "deletes.parquet")
    pq.write_table(pa.table({"file_path": [paths[1]], "pos": pa.array([3], pa.int64())}), delete_path)
    delete = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES, file_path=delete_path, file_format=FileFormat.PARQUET, partition=table.scan().plan_files()[0].file.partition,
        record_count=1, file_size_in_bytes=Path(delete_path).stat().st_size,
        sort_order_id=None, equality_ids=None, key_metadata=None,
        lower_bounds={PATH_FIELD_ID: paths[1].encode()}, upper_bounds={PATH_FIELD_ID: paths[1].encode()},
    )
    delete.spec_id = 0
    with table.transaction() as transaction, private.row_delta_producer(transaction, {}) as snapshot:
        snapshot.append_delete_file(delete)
    table = table.refresh()
    candidates = dict(candidate_files(table, table.current_snapshot().snapshot_id, ["id"], pa.table({"id": pa.array([50, 150], pa.int64())})))
    assert candidates == {paths[0]: [], paths[1]: [delete_path]}
