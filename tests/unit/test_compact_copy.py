"""Compaction's copy of files written alike (spark_jobs/compact_job.concatenated): their row groups
moved byte for byte into one file, against a real Iceberg table (SQLite catalog, files on disk)
read back by pyiceberg and DuckDB."""

from __future__ import annotations

import datetime
import decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyarrow import fs as pafs
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.conversions import from_bytes
from pyiceberg.schema import Schema
from pyiceberg.types import (
    DecimalType,
    DoubleType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestamptzType,
)

from service.core import keys
from service.iceberg.appends import append_files
from service.iceberg.rewrites import live_data_files, replace_files
from spark_jobs.compact_job import COPIED_ROW_GROUP_ROWS, rewrite_run
from spark_jobs.files import DICTIONARY_PAGE_BYTES, conform
from tests.harness import duckdb_rows

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True), NestedField(2, "ts", TimestamptzType(), required=True),
    NestedField(3, "msg", StringType()), NestedField(4, "latency", DoubleType()), NestedField(5, "amount", DecimalType(12, 2)),
    NestedField(6, "http", StructType(NestedField(7, "method", StringType()), NestedField(8, "status", LongType()))),
    NestedField(9, "tags", ListType(10, StringType())), NestedField(11, "labels", MapType(12, StringType(), 13, StringType())),
)
START = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
ROWS = COPIED_ROW_GROUP_ROWS + 1000


def rows(schema: pa.Schema, first: int, count: int = ROWS) -> pa.Table:
    """`count` rows from id `first` in `schema` (SCHEMA's, with the field ids its table took):
    every type, with nulls among them."""
    ids = range(first, first + count)
    return pa.table({
        "id": pa.array(ids, pa.int64()), "ts": pa.array([START + datetime.timedelta(seconds=i) for i in ids], pa.timestamp("us", "UTC")),
        "msg": [None if i % 7 == 0 else f"request {i} handled" for i in ids], "latency": [i / 3 for i in ids],
        "amount": [decimal.Decimal(i % 5000) / 100 for i in ids],
        "http": [None if i % 11 == 0 else {"method": "GET" if i % 2 else "POST", "status": 200 + i % 5} for i in ids],
        "tags": [[f"t{i % 3}"] * (i % 3) for i in ids], "labels": [[("app", f"a{i % 4}")] if i % 5 else [] for i in ids],
    }, schema=schema)


def written(path: Path, *tables: pa.Table, schema: pa.Schema | None = None) -> str:
    """A file as a writer's task writes it (zstd, its dictionary limit), a row group per table."""
    with pq.ParquetWriter(path, schema or tables[0].schema, compression="zstd", dictionary_pagesize_limit=DICTIONARY_PAGE_BYTES) as writer:
        for table in tables:
            writer.write_table(table)
    return path.as_uri()


@pytest.fixture
def table(tmp_path: Path):  # noqa: ANN201
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=(tmp_path / "wh").as_uri())
    catalog.create_namespace("n")
    return catalog.create_table(("n", "t"), SCHEMA, properties={"format-version": "2"})


def row_groups(path: str) -> list[list[bytes]]:
    """Each row group's column chunks, as bytes."""
    local = path.removeprefix("file://")
    metadata, data = pq.read_metadata(local), Path(local).read_bytes()
    found = []
    for group in range(metadata.num_row_groups):
        columns = [metadata.row_group(group).column(index) for index in range(metadata.num_columns)]
        found.append([data[start:start + column.total_compressed_size] for column in columns
                      for start in [column.dictionary_page_offset if column.has_dictionary_page else column.data_page_offset]])
    return found


def in_schema(path: str, schema: pa.Schema) -> pa.Table:
    """A file's rows as the rewrite reads them: in `schema`, a column it lacks null."""
    return pa.Table.from_batches([conform(batch, schema) for batch in pq.read_table(path.removeprefix("file://")).to_batches()], schema=schema)


def test_files_written_alike_are_copied_row_group_by_row_group_and_read_back_as_they_were(table, tmp_path: Path) -> None:  # noqa: ANN001
    """Three files of the table's schema (one of two row groups) become one file of their four row
    groups, each column chunk the same bytes: nothing decoded or encoded again. The replace commits
    (its row count checked against the files it replaces), pyiceberg and DuckDB read the rows as
    they were, and the statistics the table keeps of the file are those of the three together."""
    schema = table.schema().as_arrow()
    sources = [written(tmp_path / "a.parquet", rows(schema, 0)), written(tmp_path / "b.parquet", rows(schema, ROWS), rows(schema, 2 * ROWS)),
               written(tmp_path / "c.parquet", rows(schema, 3 * ROWS))]
    with table.transaction() as transaction:
        append_files(transaction, sources, {keys.SUMMARY_WATERMARK: "1-0"})
    before, duckdb_before = table.scan().to_arrow().sort_by("id"), sorted(duckdb_rows(table), key=lambda row: row["id"])
    kept = {file.file_path: file for file in live_data_files(table).values()}

    merged = (tmp_path / "merged.parquet").as_uri()
    layout = rewrite_run(sources, schema, pafs.LocalFileSystem(), merged.removeprefix("file://"), {}, ["id", "ts"])

    assert layout == [[sources[0], 0, ROWS, []], [sources[1], ROWS, 2 * ROWS, []], [sources[2], 3 * ROWS, ROWS, []]]
    assert row_groups(merged) == [group for source in sources for group in row_groups(source)]
    with table.transaction() as transaction:
        done = replace_files(table, transaction, sources, [merged], {keys.SUMMARY_WATERMARK: "2-0"})
    assert (done.files_removed, done.files_added, done.rows) == (3, 1, 4 * ROWS)
    assert table.scan().to_arrow().sort_by("id").equals(before)
    assert sorted(duckdb_rows(table), key=lambda row: row["id"]) == duckdb_before
    copy = live_data_files(table)[merged]
    assert copy.record_count == 4 * ROWS
    leaves = [field_id for field_id in range(1, table.schema().highest_field_id + 1) if table.schema().find_type(field_id).is_primitive]
    assert len(leaves) == 10
    for field_id in leaves:
        kind = table.schema().find_type(field_id)
        assert copy.null_value_counts[field_id] == sum(file.null_value_counts[field_id] for file in kept.values())
        assert copy.value_counts[field_id] == sum(file.value_counts[field_id] for file in kept.values())
        if field_id in copy.lower_bounds:
            assert from_bytes(kind, copy.lower_bounds[field_id]) == min(from_bytes(kind, file.lower_bounds[field_id]) for file in kept.values())
            assert from_bytes(kind, copy.upper_bounds[field_id]) == max(from_bytes(kind, file.upper_bounds[field_id]) for file in kept.values())


def test_a_file_not_written_alike_is_encoded_again_in_its_place_among_those_copied(table, tmp_path: Path) -> None:  # noqa: ANN001
    """Where copying a file's row groups would not give the rows the rewrite reads (another schema,
    other field ids, other metadata than the files copied before it), or would keep many tiny
    row groups, its rows are encoded again, into a row group in their place between the copied
    ones: the file holds every source's rows in order, as the rewrite reads them."""
    schema = table.schema().as_arrow()
    alike = written(tmp_path / "alike.parquet", rows(schema, 0))
    store = pafs.LocalFileSystem()
    cases = {
        # written before a column was added: the rewrite reads it as null
        "older schema": written(tmp_path / "older.parquet", rows(schema, ROWS).drop_columns(["labels"])),
        # the same columns under other field ids (a column dropped and added again)
        "other ids": written(tmp_path / "ids.parquet", rows(schema, ROWS).cast(pa.schema(
            [field.with_metadata({b"PARQUET:field_id": str(100 + index).encode()}) for index, field in enumerate(schema)]))),
        # footers told apart by their metadata (a bucket's number, another writer's schema)
        "other metadata": written(tmp_path / "meta.parquet", rows(schema, ROWS), schema=schema.with_metadata({b"bucket": b"3"})),
        # a quiet producer's file: row groups of a few rows each
        "tiny row groups": written(tmp_path / "tiny.parquet", *[rows(schema, ROWS + i * 10, 10) for i in range(40)]),
        # the control: another file written alike, copied too
        "alike": written(tmp_path / "also.parquet", rows(schema, ROWS)),
    }
    for number, (why, other) in enumerate(cases.items()):
        for sources in ([alike, other], [other, alike]):
            out = str(tmp_path / f"out-{number}-{sources[0] == alike}.parquet")
            layout = rewrite_run(sources, schema, store, out, {}, ["id", "ts"])
            counts = [pq.read_metadata(source.removeprefix("file://")).num_rows for source in sources]
            assert layout == [[sources[0], 0, counts[0], []], [sources[1], counts[0], counts[1], []]], why
            assert pq.read_table(out).cast(schema).equals(pa.concat_tables([in_schema(source, schema) for source in sources])), why
            # Copied: every file written alike, but of two whose metadata differ, the first only.
            copied = [True, False] if why == "other metadata" else [why == "alike" or source == alike for source in sources]
            # Each copied file's row groups as they were, each encoded file's rows in a row group of their own.
            expected = [group for source, copy in zip(sources, copied) for group in (row_groups(source) if copy else [None])]
            groups = row_groups(out)
            assert len(groups) == len(expected), why
            assert [group if want is not None else None for group, want in zip(groups, expected)] == expected, (why, sources)
            assert all(group != part for group, want in zip(groups, expected) if want is None
                       for source in sources for part in row_groups(source)), (why, sources)
