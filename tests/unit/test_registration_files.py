"""What a registered file's DataFile says (service/iceberg/registration.py), on real Parquet files
and a real (SQLite) catalog's table: partition values from exact statistics or from the values,
field ids honoured and checked, the footer bound."""

from __future__ import annotations

from datetime import date, datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import BucketTransform, DayTransform, IdentityTransform
from pyiceberg.types import DateType, ListType, LongType, NestedField, StringType, StructType, TimestamptzType

from service.iceberg.registration import TAIL_BYTES, FileRefused, read_footer, registered_data_file

SCHEMA = Schema(
    NestedField(1, "ts", TimestamptzType()), NestedField(2, "name", StringType()),
    NestedField(3, "n", LongType()), NestedField(4, "d", DateType()),
)
TS = pa.timestamp("us", tz="UTC")


@pytest.fixture
def catalog(tmp_path: Path) -> SqlCatalog:
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=(tmp_path / "wh").as_uri())
    catalog.create_namespace("n")
    return catalog


def table(catalog: SqlCatalog, *fields: PartitionField):  # noqa: ANN201
    return catalog.create_table(("n", f"t{len(catalog.list_tables('n'))}"), SCHEMA, partition_spec=PartitionSpec(*fields))


def write(tmp_path: Path, name: str, columns: dict, schema: pa.Schema | None = None, **options) -> str:  # noqa: ANN003
    path = tmp_path / name
    pq.write_table(pa.table(columns, schema=schema), path, **options)
    return path.as_uri()


def describe(target, path: str):  # noqa: ANN001, ANN201
    return registered_data_file(target.metadata, target.io, path, 1 << 20)


def test_a_day_partition_comes_from_statistics_and_a_string_identity_from_the_values(catalog, tmp_path: Path) -> None:  # noqa: ANN001
    target = table(catalog, PartitionField(1, 1000, DayTransform(), "ts_day"), PartitionField(2, 1001, IdentityTransform(), "name"))
    ts = [datetime(2026, 11, 20, 1, tzinfo=timezone.utc), datetime(2026, 11, 20, 23, tzinfo=timezone.utc)]
    # Statistics of strings are truncated by some writers: two names sharing a long prefix.
    one = write(tmp_path, "one.parquet", {"ts": pa.array(ts, TS), "name": ["a-very-long-shared-prefix-1"] * 2})
    assert describe(target, one).partition[0] == (date(2026, 11, 20) - date(1970, 1, 1)).days
    assert describe(target, one).partition[1] == "a-very-long-shared-prefix-1"
    two = write(tmp_path, "two.parquet", {"ts": pa.array(ts, TS), "name": ["a-very-long-shared-prefix-1", "a-very-long-shared-prefix-2"]},
                write_statistics=False)
    with pytest.raises(FileRefused) as refused:
        describe(target, two)
    assert refused.value.reason == "partition" and "name" in str(refused.value)


def test_nulls_are_a_partition_value_of_their_own(catalog, tmp_path: Path) -> None:  # noqa: ANN001
    target = table(catalog, PartitionField(4, 1000, IdentityTransform(), "d"))
    assert describe(target, write(tmp_path, "nulls.parquet", {"d": pa.array([None, None], pa.date32())})).partition[0] is None
    mixed = write(tmp_path, "mixed.parquet", {"d": pa.array([None, date(2026, 1, 1)], pa.date32())})
    with pytest.raises(FileRefused, match="2 values of partition d"):
        describe(target, mixed)
    # Without statistics the values say the same.
    unstated = write(tmp_path, "unstated.parquet", {"d": pa.array([None, date(2026, 1, 1)], pa.date32())}, write_statistics=False)
    with pytest.raises(FileRefused, match="2 values of partition d"):
        describe(target, unstated)


def test_a_bucket_partition_is_computed_from_the_values(catalog, tmp_path: Path) -> None:  # noqa: ANN001
    target = table(catalog, PartitionField(3, 1000, BucketTransform(4), "n_bucket"))
    bucket = BucketTransform(4).transform(LongType())
    same = [n for n in range(100) if bucket(n) == bucket(7)][:3]
    assert describe(target, write(tmp_path, "b.parquet", {"n": pa.array(same, pa.int64())})).partition[0] == bucket(7)
    other = next(n for n in range(100) if bucket(n) != bucket(7))
    with pytest.raises(FileRefused):
        describe(target, write(tmp_path, "c.parquet", {"n": pa.array([7, other], pa.int64())}))


def test_field_ids_in_the_file_must_name_the_tables_columns(catalog, tmp_path: Path) -> None:  # noqa: ANN001
    target = table(catalog)
    ids = lambda *pairs: pa.schema([pa.field(n, t, metadata={b"PARQUET:field_id": str(i).encode()}) for n, t, i in pairs])  # noqa: E731
    good = write(tmp_path, "ids.parquet", {"name": ["x"], "n": [5]}, schema=ids(("name", pa.string(), 2), ("n", pa.int64(), 3)))
    described = describe(target, good)
    assert described.record_count == 1 and set(described.value_counts) == {2, 3}, "statistics keyed by the table's field ids"
    swapped = write(tmp_path, "swapped.parquet", {"name": ["x"]}, schema=ids(("name", pa.string(), 1)))
    with pytest.raises(FileRefused) as refused:
        describe(target, swapped)
    assert refused.value.reason in ("columns", "types") and "ts" in str(refused.value)


def test_nested_columns_are_matched_by_name_and_their_leaves_get_statistics(catalog, tmp_path: Path) -> None:  # noqa: ANN001
    """A struct and a list column of a file without field ids: matched through the table's name
    mapping down to their leaves, with the statistics pyiceberg's own append of the rows carries."""
    nested = Schema(
        NestedField(1, "name", StringType()),
        NestedField(2, "device", StructType(NestedField(3, "os", StringType()), NestedField(4, "build", LongType()))),
        NestedField(5, "tags", ListType(6, StringType(), element_required=False)),
    )
    target = catalog.create_table(("n", "nested"), nested)
    columns = {
        "name": ["a", "b"],
        "device": [{"os": "linux", "build": 7}, {"os": "mac", "build": None}],
        "tags": [["x", "y"], []],
    }
    described = describe(target, write(tmp_path, "nested.parquet", columns))
    # pyiceberg's own append of the same rows: the statistics its commits carry.
    target.append(pa.table(columns, schema=target.schema().as_arrow()))
    (own,) = [task.file for task in target.scan().plan_files()]
    assert described.record_count == own.record_count == 2
    for metric in ("value_counts", "null_value_counts", "lower_bounds", "upper_bounds"):
        assert getattr(described, metric) == getattr(own, metric), metric
    leaves = {target.schema().find_field(name).field_id for name in ("device.os", "device.build", "tags.element")}
    assert leaves <= set(described.value_counts), "the leaves are counted under the table's ids"
    # A leaf of another type than the table's is refused, naming it.
    wrong = write(tmp_path, "wrong.parquet", {"device": [{"os": "linux", "build": "seven"}]})
    with pytest.raises(FileRefused) as refused:
        describe(target, wrong)
    assert refused.value.reason == "types" and "build" in str(refused.value)


def test_the_footer_bound_and_the_parquet_magic(catalog, tmp_path: Path) -> None:  # noqa: ANN001
    target = table(catalog)
    wide = write(tmp_path, "wide.parquet", {"name": ["x" * 10] * 10, "n": list(range(10))}, row_group_size=1)
    with pytest.raises(FileRefused) as refused:
        registered_data_file(target.metadata, target.io, wide, max_footer_bytes=1024)
    assert refused.value.reason == "footer"
    text = tmp_path / "text.parquet"
    text.write_text("not parquet at all, but long enough")
    with pytest.raises(FileRefused) as refused:
        describe(target, text.as_uri())
    assert refused.value.reason == "not_parquet"


def test_a_footer_longer_than_the_first_read_of_the_files_end_is_read_whole(catalog, tmp_path: Path) -> None:  # noqa: ANN001
    """read_footer reads the file's last TAIL_BYTES at once; a longer footer takes a second read."""
    target = table(catalog)
    rows = 3000
    many = write(tmp_path, "many.parquet", {"name": [f"name-{i:05d}" for i in range(rows)], "n": list(range(rows))}, row_group_size=1)
    footer, size = read_footer(target.io, many, 1 << 24)
    assert footer.num_row_groups == rows
    assert footer.serialized_size > TAIL_BYTES, "the footer must not fit in the first read for this test to mean anything"
    assert size == Path(many.removeprefix("file://")).stat().st_size
    data_file = describe(target, many)
    assert data_file.record_count == rows
    assert data_file.lower_bounds[2] == b"name-00000" and data_file.upper_bounds[2] == b"name-02999"


def test_the_apis_description_gives_the_leader_the_same_data_file_until_the_table_changes(catalog, tmp_path: Path) -> None:  # noqa: ANN001
    import orjson

    from service.iceberg.registration import committed_data_file, described_data_file
    from service.iceberg.registration import describe as description_of

    target = table(catalog, PartitionField(1, 1000, DayTransform(), "ts_day"), PartitionField(2, 1001, IdentityTransform(), "name"),
                   PartitionField(3, 1002, BucketTransform(4), "n_bucket"))
    path = write(tmp_path, "one.parquet", {"ts": pa.array([datetime(2026, 11, 20, 1, tzinfo=timezone.utc)] * 2, TS), "name": ["é"] * 2,
                                           "n": pa.array([7, 7], pa.int64()), "d": pa.array([date(2026, 1, 1), None], pa.date32())})
    checked = describe(target, path)
    description = orjson.loads(orjson.dumps(description_of(checked, target.metadata.current_schema_id)))  # as it crosses Redis
    described = described_data_file(target.metadata, path, description)
    fields = ("file_path", "partition", "record_count", "file_size_in_bytes", "column_sizes", "value_counts", "null_value_counts",
              "nan_value_counts", "lower_bounds", "upper_bounds", "split_offsets", "spec_id", "content", "file_format")
    assert {f: getattr(described, f) for f in fields} == {f: getattr(checked, f) for f in fields}
    assert committed_data_file(target.metadata, target.io, path, description, 1 << 20) is not None
    # The file changed after it was registered: refused, not committed from the description.
    Path(path.removeprefix("file://")).write_bytes(Path(path.removeprefix("file://")).read_bytes() + b"x")
    with pytest.raises(FileRefused, match="changed after it was registered"):
        committed_data_file(target.metadata, target.io, path, description, 1 << 20)
    # The schema moved on: the description no longer holds, the leader reads the file itself.
    with target.update_schema() as update:
        update.add_column("extra", StringType())
    assert described_data_file(catalog.load_table(target.name()).metadata, path, description) is None
