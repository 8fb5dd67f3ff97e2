"""How a job's Parquet reaches storage Spark cannot write itself (spark_jobs/files.py), and how the
roles reach the same files (service/iceberg/files.py): the pure parts, without servers."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyarrow import fs as pafs
from pyiceberg.io.pyarrow import PyArrowFileIO

from service.iceberg.files import list_data_files, locate, spark_filesystem
from spark_jobs.files import DICTIONARY_PAGE_BYTES, conform, runs, write_runs


def test_runs_split_a_batch_where_any_key_changes_nulls_included() -> None:
    batch = pa.record_batch({"a": [1, 1, 2, 2, None, None, 1], "b": ["x", "x", "x", "y", "y", "y", "y"], "v": list(range(7))})
    got = [(key, part.column("v").to_pylist()) for key, part in runs(batch, ["a", "b"])]
    assert got == [((1, "x"), [0, 1]), ((2, "x"), [2]), ((2, "y"), [3]), ((None, "y"), [4, 5]), ((1, "y"), [6])]
    assert [part.num_rows for _key, part in runs(batch, [])] == [7]
    assert list(runs(batch.slice(0, 0), ["a"])) == []


def test_conform_orders_casts_and_fills_missing_columns_with_nulls() -> None:
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("n", pa.int64()), pa.field("added", pa.string())])
    batch = pa.record_batch({"n": pa.array([1, 2], pa.int32()), "id": pa.array([7, 8], pa.int64()), "dropped": ["a", "b"]})
    got = conform(batch, schema)
    assert got.schema == schema
    assert got.to_pylist() == [{"id": 7, "n": 1, "added": None}, {"id": 8, "n": 2, "added": None}]


def test_written_files_keep_a_dictionary_only_for_columns_of_few_values(tmp_path) -> None:  # noqa: ANN001
    """A column of a value per row stops its dictionary at DICTIONARY_PAGE_BYTES and is written
    plain past it (pyarrow's default hashes all of it into a dictionary of up to 1 MiB); a column
    of a few values keeps its whole dictionary. The rows and their statistics are the same."""
    import pyarrow.parquet as pq

    rows = 20_000
    table = pa.table({"ts": pa.array(range(rows), pa.int64()), "msg": [f"request {n} served in {n % 977} ms" for n in range(rows)],
                      "level": ["info", "warn", "error", "debug"] * (rows // 4)})
    [(path, written, _key)] = write_runs(table.to_batches(), str(tmp_path / "limited"), pafs.LocalFileSystem(), table.schema, [])
    pq.write_table(table, tmp_path / "default.parquet", compression="zstd")

    def dictionary_bytes(file: str) -> dict[str, int]:
        group = pq.ParquetFile(file).metadata.row_group(0)
        return {(c := group.column(i)).path_in_schema: c.data_page_offset - c.dictionary_page_offset for i in range(group.num_columns)}

    limited, default = dictionary_bytes(path), dictionary_bytes(str(tmp_path / "default.parquet"))
    assert limited["ts"] <= DICTIONARY_PAGE_BYTES < default["ts"] and limited["msg"] <= DICTIONARY_PAGE_BYTES < default["msg"]
    assert limited["level"] == default["level"]
    assert written == rows and pq.read_table(path).equals(table)
    assert pq.ParquetFile(path).metadata.row_group(0).column(0).statistics.max == rows - 1


def test_spark_writes_local_and_hdfs_itself_and_object_stores_through_the_catalogs_fileio(tmp_path) -> None:  # noqa: ANN001
    io = PyArrowFileIO({"s3.endpoint": "http://127.0.0.1:1", "s3.access-key-id": "k", "s3.secret-access-key": "s", "s3.region": "us-east-1"})
    assert spark_filesystem(tmp_path.as_uri(), io) is None
    assert spark_filesystem("hdfs://namenode/warehouse/t", io) is None
    store = spark_filesystem("s3://bucket/warehouse/t/data/batch-1", io)
    assert isinstance(store, pafs.S3FileSystem) and store.region == "us-east-1"  # configured by the FileIO's properties
    assert locate("s3://bucket/warehouse/t/data/x.parquet", io)[1] == "bucket/warehouse/t/data/x.parquet"


def test_a_jobs_files_are_listed_without_spark_side_files(tmp_path) -> None:  # noqa: ANN001
    directory = tmp_path / "batch-1"
    for name in ("part-0.parquet", "p0=1/part-1.parquet", "_SUCCESS", ".part-0.parquet.crc", "p0=1/.hidden.parquet"):
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(b"x")
    uri = directory.as_uri()
    assert list_data_files(uri, PyArrowFileIO()) == [f"{uri}/p0=1/part-1.parquet", f"{uri}/part-0.parquet"]
    assert list_data_files(f"{uri}-none", PyArrowFileIO()) == []


@pytest.mark.parametrize("prefix, own, back", [
    (None, ("demo", "_calve_dlq"), "_calve_dlq"),
    ("calve", ("demo", "calve_dlq"), "_calve_dlq"),
])
def test_calves_own_tables_are_spelled_as_the_catalog_allows(prefix, own, back, tmp_path) -> None:  # noqa: ANN001
    from service.iceberg.catalog import calve_table_name, get_catalog, is_reserved_table_name, table_identifier

    properties = (("calve.own-table-prefix", prefix),) if prefix else ()
    catalog = get_catalog(f"sqlite:///{tmp_path / 'c.db'}", tmp_path.as_uri(), 30_000, None, properties)
    assert table_identifier(catalog, "demo", "_calve_dlq") == own
    assert table_identifier(catalog, "demo", "logs") == ("demo", "logs")
    assert calve_table_name(catalog, own[1]) == back and calve_table_name(catalog, "logs") == "logs"
    assert is_reserved_table_name(catalog, "_calve_x") and not is_reserved_table_name(catalog, "logs")
    assert is_reserved_table_name(catalog, "calve_x") == bool(prefix)


def test_compaction_runs_split_the_files_evenly_in_order() -> None:
    from spark_jobs.compact_job import groups

    assert groups([f"f{i}" for i in range(7)], 3) == [["f0", "f1", "f2"], ["f3", "f4"], ["f5", "f6"]]
    assert groups(["a", "b"], 5) == [["a"], ["b"]]
    assert groups(["a", "b", "c"], 0) == [["a", "b", "c"]]


def test_a_compaction_task_copies_its_files_in_the_tables_schema_or_fails_leaving_nothing(tmp_path) -> None:  # noqa: ANN001
    """The function each compaction task runs (spark_jobs/compact_job.py), without Spark: files
    written before a column was added read it as null; a required column that is null in a file
    fails the task (Spark's reader and writer then do the rewrite) and leaves no output behind."""
    import pyarrow.parquet as pq

    from spark_jobs.compact_job import _copier

    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("msg", pa.string()), pa.field("added", pa.int32())])
    old, new = tmp_path / "old.parquet", tmp_path / "new.parquet"
    pq.write_table(pa.table({"id": [1, 2], "msg": ["a", "b"]}), old)
    pq.write_table(pa.table({"id": [3], "msg": ["c"], "added": pa.array([7], pa.int32())}), new)
    out = tmp_path / "out"
    copy = _copier(str(out), pafs.LocalFileSystem(), schema)
    listing = pa.record_batch({"index": [0], "paths": [f"{old.as_uri()}\n{new}"]})
    (answer,) = [row for batch in copy(iter([listing])) for row in batch.to_pylist()]
    assert answer["rows"] == 3
    written = pq.read_table(answer["path"])
    assert written.schema == schema and written.to_pylist() == [
        {"id": 1, "msg": "a", "added": None}, {"id": 2, "msg": "b", "added": None}, {"id": 3, "msg": "c", "added": 7},
    ]
    broken = tmp_path / "broken.parquet"
    pq.write_table(pa.table({"id": pa.array([None], pa.int64()), "msg": ["x"]}), broken)
    copy = _copier(str(tmp_path / "out2"), pafs.LocalFileSystem(), schema)
    with pytest.raises(ValueError, match="required column 'id'"):
        list(copy(iter([pa.record_batch({"index": [0], "paths": [f"{old}\n{broken}"]})])))
    assert not list((tmp_path / "out2").glob("*.parquet"))


def test_a_compaction_task_reads_files_written_before_a_struct_gained_a_field(tmp_path) -> None:  # noqa: ANN001
    """A struct column (and a list of structs) that gained a field since a file was written: the
    file's rows read the new field as null, in the table's schema with its field ids. (pyarrow
    casts a struct to a bigger one from 19 on, and reordered from 21: the version pyproject asks
    for. Before, such a file failed compaction and row changes on an object store, where no Spark
    reader takes over.)"""
    import pyarrow.parquet as pq

    from spark_jobs.compact_job import _copier

    def field(name: str, data_type: pa.DataType, field_id: int) -> pa.Field:
        return pa.field(name, data_type, metadata={b"PARQUET:field_id": str(field_id).encode()})

    def schema(grown: bool) -> pa.Schema:
        http = [field("status", pa.int32(), 3), *([field("method", pa.string(), 7)] if grown else [])]
        tag = [field("k", pa.string(), 6), *([field("v", pa.string(), 8)] if grown else [])]
        return pa.schema([field("id", pa.int64(), 1), field("http", pa.struct(http), 2), field("tags", pa.list_(field("element", pa.struct(tag), 5)), 4)])

    old, new = tmp_path / "old.parquet", tmp_path / "new.parquet"
    pq.write_table(pa.table({"id": [1, 2], "http": [{"status": 200}, None], "tags": [[{"k": "a"}], None]}, schema=schema(False)), old)
    pq.write_table(pa.table({"id": [3], "http": [{"status": 500, "method": "GET"}], "tags": [[{"k": "b", "v": "c"}]]}, schema=schema(True)), new)
    copy = _copier(str(tmp_path / "out"), pafs.LocalFileSystem(), schema(True))
    (answer,) = [row for batch in copy(iter([pa.record_batch({"index": [0], "paths": [f"{old}\n{new}"]})])) for row in batch.to_pylist()]
    written = pq.read_table(answer["path"])
    assert written.schema == schema(True) and [f.metadata for f in written.schema] == [f.metadata for f in schema(True)]
    assert written.to_pylist() == [
        {"id": 1, "http": {"status": 200, "method": None}, "tags": [{"k": "a", "v": None}]},
        {"id": 2, "http": None, "tags": None},
        {"id": 3, "http": {"status": 500, "method": "GET"}, "tags": [{"k": "b", "v": "c"}]},
    ]


def test_a_compaction_task_leaves_out_the_rows_position_deletes_delete(tmp_path) -> None:  # noqa: ANN001
    """Merge-on-read: the rows a file's position delete files delete are left out as it is copied,
    at their places across the reader's batches (65,536 rows each); a delete file's rows for other
    files are not applied to it; a run whose every row is deleted leaves no file."""
    import pyarrow.parquet as pq

    from spark_jobs.compact_job import _copier

    schema = pa.schema([pa.field("id", pa.int64(), nullable=False)])
    big, gone = tmp_path / "big.parquet", tmp_path / "gone.parquet"
    pq.write_table(pa.table({"id": pa.array(range(70_000), pa.int64())}), big)
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int64())}), gone)
    first, second, all_gone = tmp_path / "d1.parquet", tmp_path / "d2.parquet", tmp_path / "d3.parquet"
    pq.write_table(pa.table({"file_path": [big.as_uri(), big.as_uri(), "file:///elsewhere.parquet"], "pos": pa.array([5, 65_540, 7], pa.int64())}), first)
    pq.write_table(pa.table({"file_path": [big.as_uri()], "pos": pa.array([69_999], pa.int64())}), second)
    pq.write_table(pa.table({"file_path": [gone.as_uri()] * 2, "pos": pa.array([0, 1], pa.int64())}), all_gone)
    copy = _copier(str(tmp_path / "out"), pafs.LocalFileSystem(), schema, {big.as_uri(): [str(first), second.as_uri()]})
    (answer,) = [row for batch in copy(iter([pa.record_batch({"index": [0], "paths": [big.as_uri()]})])) for row in batch.to_pylist()]
    assert answer["rows"] == 70_000 - 3
    assert set(range(70_000)) - set(pq.read_table(answer["path"]).column("id").to_pylist()) == {5, 65_540, 69_999}
    copy = _copier(str(tmp_path / "out2"), pafs.LocalFileSystem(), schema, {gone.as_uri(): [str(all_gone)]})
    (answer,) = [row for batch in copy(iter([pa.record_batch({"index": [0], "paths": [gone.as_uri()]})])) for row in batch.to_pylist()]
    assert answer["rows"] == 0 and not list((tmp_path / "out2").glob("*.parquet"))
