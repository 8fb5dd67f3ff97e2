"""Compaction that folds merge-on-read position deletes back in (service/iceberg/compaction.py,
rewrites.replace_files, private._ReplaceFiles), on real Iceberg tables read back by pyiceberg:
which files are planned, and a replace that removes data files together with the delete files
applied to them, keeps the other delete files as delete files, and refuses a stale plan."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.manifest import DataFileContent, ManifestContent

from service.core.exceptions import FilesNotLive, RowsChanged
from service.iceberg.compaction import CompactionPolicy, compactable, plan_compaction
from service.iceberg.rewrites import live_files, overwrite_files, referenced_data_file, replace_files, row_delta
from spark_jobs.compact_job import _copier
from tests.harness import duckdb_rows
from tests.unit.tables import SCHEMA, START, three_files


@pytest.fixture
def table(tmp_path: Path):  # noqa: ANN201
    return three_files(tmp_path)


def data_paths(table) -> list[str]:  # noqa: ANN001
    """The data files, by their first id."""
    data, _deletes = live_files(table)
    return sorted(data, key=lambda path: data[path].lower_bounds[1])


def delete_rows(table, tmp_path: Path, positions: dict[str, list[int]], replacing: bool = False):  # noqa: ANN001, ANN201
    """One merge-on-read commit deleting `positions` of each data file (a delete file each, all in
    one delete manifest); the table refreshed and the delete files' paths by data file. With
    `replacing`, as row_delta_job.py writes them: each delete file also holds the positions of its
    data file's delete files so far, and replaces them."""
    deletes, written = [], {}
    _data, live_deletes = live_files(table)
    for number, (data, rows) in enumerate(positions.items()):
        earlier = [file.file_path for file in live_deletes if referenced_data_file(file) == data] if replacing else []
        rows = sorted({*rows, *(pos for path in earlier for pos in pq.read_table(path.removeprefix("file://")).column("pos").to_pylist())})
        path = str(tmp_path / f"deletes-{len(list(tmp_path.iterdir()))}-{number}.parquet")
        pq.write_table(pa.table({"file_path": [data] * len(rows), "pos": pa.array(rows, pa.int64())}), path)
        deletes.append([path, data, len(rows), Path(path).stat().st_size, earlier])
        written[data] = path
    with table.transaction() as transaction:
        row_delta(table, transaction, [], deletes, {})
    return table.refresh(), written


def rewrite(table, tmp_path: Path, name: str, paths: list[str]) -> str:  # noqa: ANN001
    """The live rows of `paths` (their deletes applied, as the compaction job applies them) in one new file."""
    rows = table.scan().to_arrow()
    ids = {i for path in paths for i in pq.read_table(path.removeprefix("file://")).column("id").to_pylist()}
    kept = rows.filter(pa.array([i in ids for i in rows.column("id").to_pylist()]))
    pq.write_table(kept, tmp_path / name)
    return (tmp_path / name).as_uri()


def ids(table) -> list[int]:  # noqa: ANN001
    """The table's ids as pyiceberg reads them, once DuckDB's iceberg extension is seen to read the
    same, every manifest is seen to hold files of its own content only, and none that only
    records an earlier snapshot's deletions is carried on."""
    table = table.refresh()
    current = table.current_snapshot()
    for manifest in current.manifests(table.io):
        assert manifest.has_added_files() or manifest.has_existing_files() or manifest.added_snapshot_id == current.snapshot_id, \
            "a manifest of an earlier snapshot's deleted entries only is carried on"
        contents = {entry.data_file.content for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False)}
        expected = {DataFileContent.DATA} if manifest.content == ManifestContent.DATA else {DataFileContent.POSITION_DELETES}
        assert contents <= expected, f"a {manifest.content.name} manifest holds {contents}"
    read = sorted(table.scan().to_arrow().column("id").to_pylist())
    assert sorted(row["id"] for row in duckdb_rows(table)) == read, "DuckDB reads what pyiceberg reads"
    return read


def test_files_with_enough_deleted_rows_are_planned_with_their_delete_files_whatever_their_size(table, tmp_path: Path) -> None:  # noqa: ANN001
    first, second, _third = data_paths(table)
    table, written = delete_rows(table, tmp_path, {first: list(range(40)), second: [5]})
    # No file is small against a target this size: only the deletes can make a file worth rewriting.
    big = CompactionPolicy(target_file_bytes=1024 * 1024, min_files=2, max_bytes=1 << 30)
    tiny = {"target_file_bytes": 1, "min_files": 2, "max_bytes": 1 << 30}
    (group,) = plan_compaction(compactable(table), CompactionPolicy(**tiny, deleted_share=0.3, delete_files=10))
    assert group.deletes == {first: [written[first]]} and [file.file_path for file in group.files] == [first]
    assert plan_compaction(compactable(table), CompactionPolicy(**tiny, deleted_share=0.5, delete_files=10)) == [], "40% deleted is below half"
    (both,) = plan_compaction(compactable(table), CompactionPolicy(**tiny, deleted_share=0.5, delete_files=1))
    assert both.deletes == {first: [written[first]], second: [written[second]]}
    # Small files fold their deletes in as they are merged, however few rows those delete.
    (small,) = plan_compaction(compactable(table), big)
    assert len(small.files) == 3 and small.deletes == {first: [written[first]], second: [written[second]]}


def test_a_partition_is_compacted_once_a_reader_opens_min_files_there_its_delete_files_counted(table, tmp_path: Path) -> None:  # noqa: ANN001
    first, second, _third = data_paths(table)
    four = CompactionPolicy(target_file_bytes=1024 * 1024, min_files=4, max_bytes=1 << 30)
    assert plan_compaction(compactable(table), four) == [], "three small files are fewer than four"
    table, written = delete_rows(table, tmp_path, {first: [3], second: [5]})
    assert not any(four.folds(candidate) for candidate in compactable(table)), "a row of 100: no file's deletes fold it"
    # Three data files and two delete files: a reader opens five.
    (group,) = plan_compaction(compactable(table), four)
    assert len(group.files) == 3 and group.deletes == {first: [written[first]], second: [written[second]]}
    assert plan_compaction(compactable(table), CompactionPolicy(1024 * 1024, min_files=6, max_bytes=1 << 30)) == []


def test_a_replace_folds_deletes_in_and_keeps_the_other_delete_files_as_delete_files(table, tmp_path: Path) -> None:  # noqa: ANN001
    first, second, third = data_paths(table)
    table, written = delete_rows(table, tmp_path, {first: [3, 4], second: [5]})  # both in one delete manifest
    expected = [i for i in range(300) if i not in (3, 4, 105)]
    assert ids(table) == expected
    merged = rewrite(table, tmp_path, "merged.parquet", [first, third])
    # A copy that left out rows its plan did not fold in: refused.
    with pytest.raises(RowsChanged), table.transaction() as transaction:
        replace_files(table, transaction, [first, third], [merged], {})
    with pytest.raises(RowsChanged), table.transaction() as transaction:  # rows must be those left after the deletes
        replace_files(table, transaction, [first, third], [rewrite(table, tmp_path, "short.parquet", [third])], {}, {first: [written[first]]})
    with table.transaction() as transaction:
        done = replace_files(table, transaction, [first, third], [merged], {}, {first: [written[first]]})
    assert (done.files_removed, done.files_added, done.rows, done.delete_files_removed) == (2, 1, 198, 1)
    table = table.refresh()
    data, deletes = live_files(table)
    assert sorted(data) == sorted([merged, second])
    # The second file's delete file survived the rewrite of their shared delete manifest as a delete file.
    assert [(file.file_path, file.content.value) for file in deletes] == [(written[second], 1)]
    assert ids(table) == expected, "row 105 stays deleted, rows 3 and 4 stay gone"
    assert table.current_snapshot().summary["total-position-deletes"] == "1"
    assert table.current_snapshot().summary["total-records"] == str(len(expected) + 1)


def compaction_copied(table, tmp_path: Path, first: str):  # noqa: ANN001, ANN201
    """Rows 3, 4 and 50 of the first file deleted, a compaction of every file planned (folding
    those deletes), and its copy written by the real compaction copier: (table, group, copy)."""
    from pyarrow import fs as pafs

    table, _written = delete_rows(table, tmp_path, {first: [3, 4, 50]})
    (group,) = plan_compaction(compactable(table), CompactionPolicy(1024 * 1024, min_files=2, max_bytes=1 << 30))
    sources = [file.file_path for file in group.files]
    copier = _copier(str(tmp_path / "copy"), pafs.LocalFileSystem(), table.schema().as_arrow(), group.deletes)
    (answer,) = [row for batch in copier(iter([pa.record_batch({"index": [0], "paths": ["\n".join(sources)]})])) for row in batch.to_pylist()]
    return table, group, Path(answer["path"]).as_uri()


def commit_copy(table, group, copy: str):  # noqa: ANN001, ANN201
    """The compaction's copy committed in place of its group: (the table after, the replace's
    outcome, the delete files left), once the copy is seen to be the only data file left and
    every delete file left to point at it."""
    with table.transaction() as transaction:
        done = replace_files(table, transaction, [file.file_path for file in group.files], [copy], {}, group.deletes)
    table = table.refresh()
    data, deletes = live_files(table)
    assert list(data) == [copy] and [referenced_data_file(file) for file in deletes] == [copy]
    return table, done, deletes


def test_rows_deleted_while_the_rewrite_ran_are_deleted_from_its_copy(table, tmp_path: Path) -> None:  # noqa: ANN001
    """A change stream adds delete files to the files a compaction is rewriting while it runs: at
    commit those rows are deleted from the copy too (mapped through the copy's layout, past the
    positions folded in), instead of the compaction being dropped."""
    first, third = data_paths(table)[0::2]
    table, group, copy = compaction_copied(table, tmp_path, first)
    # Meanwhile: change runs delete rows of the first file (before, between and after those folded) and of the third.
    table, _later = delete_rows(table, tmp_path, {first: [0, 5, 51, 99]})
    table, _later = delete_rows(table, tmp_path, {third: [0, 99], first: [98]})
    expected = [i for i in range(300) if i not in {3, 4, 50, 0, 5, 51, 99, 98, 200, 299}]
    assert ids(table) == expected
    table, done, deletes = commit_copy(table, group, copy)
    assert done.delete_files_removed == 4
    assert sum(file.record_count for file in deletes) == 7
    assert ids(table) == expected, "the rows deleted meanwhile stay deleted, and no other row is"
    # Without a layout (Spark's fallback writer wrote the copy) the newer deletes cannot be carried: dropped.
    table, _later = delete_rows(table, tmp_path, {copy: [1]})
    (again,) = plan_compaction(compactable(table), CompactionPolicy(1024 * 1024, min_files=1, max_bytes=1 << 30, delete_files=1))
    plain = tmp_path / "plain.parquet"
    pq.write_table(table.scan().to_arrow(), plain)
    table, _later = delete_rows(table, tmp_path, {copy: [2]})
    with pytest.raises(FilesNotLive, match="no layout"), table.transaction() as transaction:
        replace_files(table, transaction, [copy], [plain.as_uri()], {}, again.deletes)


def test_a_change_replacing_a_files_delete_files_leaves_it_one_and_a_compaction_planned_before_still_commits(table, tmp_path: Path) -> None:  # noqa: ANN001
    """Change runs that merge a data file's delete files into one of their own (row_delta_job.py)
    leave each data file one delete file, read back the same by pyiceberg and DuckDB; a compaction
    planned before them folded delete files they replaced, and still commits: every row they
    deleted that the copy holds is deleted from the copy, the rows folded in are not deleted twice."""
    first, third = data_paths(table)[0::2]
    table, group, copy = compaction_copied(table, tmp_path, first)
    table, _later = delete_rows(table, tmp_path, {first: [0, 5, 51, 99]}, replacing=True)
    table, _later = delete_rows(table, tmp_path, {third: [0, 99], first: [98]}, replacing=True)
    data, deletes = live_files(table)
    assert sorted(referenced_data_file(file) for file in deletes) == sorted([first, third]), "one delete file per data file"
    assert [file.record_count for file in deletes if referenced_data_file(file) == first] == [8]
    expected = [i for i in range(300) if i not in {3, 4, 50, 0, 5, 51, 99, 98, 200, 299}]
    assert ids(table) == expected
    table, done, deletes = commit_copy(table, group, copy)
    assert done.delete_files_removed == 2
    assert sum(file.record_count for file in deletes) == 7, "the three rows folded in are not deleted again"
    assert ids(table) == expected


def test_a_delete_file_whose_data_file_is_gone_goes_with_the_next_replace(table, tmp_path: Path) -> None:  # noqa: ANN001
    first, second, third = data_paths(table)
    table, _written = delete_rows(table, tmp_path, {second: [5]})
    # Copy-on-write removes the second file (its rows read with the deletes applied): its delete file dangles.
    copy = rewrite(table, tmp_path, "copy.parquet", [second])
    with table.transaction() as transaction:
        overwrite_files(table, transaction, [second], [copy], {})
    table = table.refresh()
    assert len(live_files(table)[1]) == 1
    merged = rewrite(table, tmp_path, "merged.parquet", [first, third])
    with table.transaction() as transaction:
        done = replace_files(table, transaction, [first, third], [merged], {})
    assert done.delete_files_removed == 1 and live_files(table.refresh())[1] == []
    assert ids(table) == [i for i in range(300) if i != 105]


def test_row_deltas_merge_small_data_manifests_as_a_merge_append_does(table, tmp_path: Path) -> None:  # noqa: ANN001
    """A run of row changes a second adds a data manifest per run: merged by the table's
    commit.manifest-merge properties, a reader plans a bounded number of them, and every row
    version and delete survives the merges."""
    with table.transaction() as transaction:
        transaction.set_properties({"commit.manifest-merge.enabled": "true", "commit.manifest.min-count-to-merge": "4"})
    table = table.refresh()
    expected = set(range(300))
    for run in range(10):
        new_id = 1000 + run
        added = tmp_path / f"added-{run}.parquet"
        pq.write_table(pa.table({
            "id": pa.array([new_id], pa.int64()), "ts": pa.array([START], pa.timestamp("us", "UTC")), "name": pa.array([f"v{run}"]),
        }, schema=SCHEMA.as_arrow()), added)
        first = data_paths(table)[0]
        position = run  # the first file's rows 0..9, one per run (replacing its earlier delete file after the first)
        deletes = []
        _data, live_deletes = live_files(table)
        earlier = [file.file_path for file in live_deletes if referenced_data_file(file) == first]
        rows = sorted({position, *(pos for path in earlier for pos in pq.read_table(path.removeprefix("file://")).column("pos").to_pylist())})
        path = str(tmp_path / f"deletes-run-{run}.parquet")
        pq.write_table(pa.table({"file_path": [first] * len(rows), "pos": pa.array(rows, pa.int64())}), path)
        deletes.append([path, first, len(rows), Path(path).stat().st_size, earlier])
        with table.transaction() as transaction:
            row_delta(table, transaction, [added.as_uri()], deletes, {})
        table = table.refresh()
        expected = (expected - {position}) | {new_id}
        data_manifests = [m for m in table.current_snapshot().manifests(table.io) if m.content == ManifestContent.DATA]
        assert len(data_manifests) <= 4, f"run {run}: {len(data_manifests)} data manifests, merged at 4"
    assert ids(table) == sorted(expected)
