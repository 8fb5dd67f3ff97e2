"""The catalog as several processes meet it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from pyiceberg.catalog.sql import SqlCatalog
from sqlalchemy.exc import OperationalError

from service.iceberg import catalog as catalog_module
from service.iceberg.catalog import get_catalog
from tests.conftest import postgres_database


def test_opening_a_fresh_catalog_survives_a_rival_creating_its_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Roles started together on a fresh catalog race to create pyiceberg's own tables; the loser
    # gets "table iceberg_tables already exists" (seen in CI when the writer and the committer
    # started in the same instant). That window, between pyiceberg's existence check and its
    # CREATE TABLE, is too narrow to hit on demand with real processes, so the rival's win is
    # staged here: its tables are created for real, then the loser's real error is raised.
    real_create = SqlCatalog.create_tables
    attempts = []

    def rival_wins_first(self: SqlCatalog) -> None:
        attempts.append(1)
        real_create(self)
        if len(attempts) == 1:
            raise OperationalError("CREATE TABLE iceberg_tables", {}, sqlite3.OperationalError("table iceberg_tables already exists"))

    monkeypatch.setattr(SqlCatalog, "create_tables", rival_wins_first)
    monkeypatch.setattr(catalog_module, "get_catalog", get_catalog.__wrapped__)
    opened = catalog_module.get_catalog(f"sqlite:///{tmp_path / 'catalog.db'}", (tmp_path / "wh").as_uri())
    assert opened.list_namespaces() == []
    assert len(attempts) == 1, "the second try found the rival's tables and created nothing"


def test_writers_creating_one_table_at_once_end_with_one_table(tmp_path: Path) -> None:
    """Many threads, each with its own catalog connection pool, create the same namespace and table
    at the same moment: all get the one table (the SQL catalog's check-then-insert lets several
    past the check; the losers' unique-key errors mean "already exists")."""
    import threading

    import pyarrow as pa

    from service.iceberg.catalog import create_table_once

    uri, warehouse = f"sqlite:///{tmp_path / 'catalog.db'}", (tmp_path / "wh").as_uri()
    catalogs = [get_catalog.__wrapped__(uri, warehouse) for _ in range(8)]
    start = threading.Barrier(len(catalogs))
    made, errors = [], []

    def create(catalog) -> None:  # noqa: ANN001
        start.wait()
        try:
            made.append(create_table_once(catalog, "acme", "events", pa.schema([pa.field("id", pa.string())])).metadata.table_uuid)
        except Exception as exc:  # noqa: BLE001 - collected and reported below
            errors.append(exc)

    threads = [threading.Thread(target=create, args=(c,)) for c in catalogs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(set(made)) == 1 and len(made) == len(catalogs)
    assert catalogs[0].list_tables("acme") == [("acme", "events")]


@pytest.fixture(params=["sqlite", "postgresql"])
def catalog_uri(request: pytest.FixtureRequest, tmp_path: Path):  # noqa: ANN201
    """A fresh SQL catalog database on each backend; PostgreSQL is skipped (saying why) when unreachable."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'catalog.db'}"
        return
    with postgres_database("calve_catalog") as url:
        yield url


def test_the_sql_catalog_opens_through_load_catalog_on_sqlite_and_postgresql(catalog_uri: str, tmp_path: Path) -> None:
    """What the writer and committer do to a table, on a catalog opened from settings alone:
    create it, append a Parquet file with a watermark, read the rows and the watermark back."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from service.core import keys
    from service.core.config import Settings
    from service.iceberg.appends import append_files
    from service.iceberg.catalog import create_table_once, load_table, open_catalog
    from service.iceberg.watermark import watermark

    settings = Settings(data_dir=tmp_path, catalog_uri=catalog_uri, catalog_properties={"init_catalog_tables": "true"})
    catalog = open_catalog(settings)
    assert type(catalog).__name__ == "SqlCatalog"
    table = create_table_once(catalog, "acme", "events", pa.schema([pa.field("id", pa.string())]))
    path = tmp_path / "part-0.parquet"
    pq.write_table(pa.table({"id": ["a", "b"]}), path)
    with table.transaction() as transaction:
        append_files(transaction, [path.as_uri()], {keys.SUMMARY_WATERMARK: "5-0"})
    reloaded = load_table(open_catalog(settings), "acme", "events")
    assert sorted(reloaded.scan().to_arrow().column("id").to_pylist()) == ["a", "b"]
    assert watermark(reloaded) == "5-0"


def test_a_transactions_metadata_is_computed_once_per_state_and_follows_each_change(tmp_path: Path) -> None:
    """private.cache_transaction_metadata, applied when a catalog is opened: reads of an unchanged
    transaction return the same metadata (pyiceberg 0.12 deep-copies it at each read), a staged
    update or a landed commit is seen at the next read, and appends commit as before."""
    import pyarrow as pa

    catalog = get_catalog(f"sqlite:///{tmp_path / 'catalog.db'}", (tmp_path / "wh").as_uri())
    catalog.create_namespace("demo")
    table = catalog.create_table(("demo", "logs"), pa.schema([("id", pa.int64())]))
    transaction = table.transaction()
    first = transaction.table_metadata
    assert transaction.table_metadata is first
    transaction.set_properties(owner="calve")
    staged = transaction.table_metadata
    assert staged is not first and staged.properties["owner"] == "calve" and "owner" not in first.properties
    transaction.commit_transaction()
    table.append(pa.table({"id": [1, 2]}))
    table.append(pa.table({"id": [3]}))
    after = table.transaction().table_metadata
    assert after.properties["owner"] == "calve" and len(after.snapshots) == 2
    assert sorted(catalog.load_table(("demo", "logs")).scan().to_arrow().column("id").to_pylist()) == [1, 2, 3]


def test_a_metadata_file_is_parsed_once_per_process_and_a_commit_is_seen_at_the_next_load(tmp_path: Path) -> None:
    """private.cache_metadata_files, applied when a catalog is opened: loads of an unchanged table
    share one parse of its metadata file; a commit (by another handle of the table) writes a new
    file, which the next load returns as it was written, equal to its parse; at most
    METADATA_FILES_KEPT files are kept."""
    import pyarrow as pa
    from pyiceberg.table.metadata import TableMetadataUtil

    from service.iceberg import private

    catalog = get_catalog(f"sqlite:///{tmp_path / 'catalog.db'}", (tmp_path / "wh").as_uri())
    catalog.create_namespace("demo")
    catalog.create_table(("demo", "logs"), pa.schema([("id", pa.int64())]))
    first, again = catalog.load_table(("demo", "logs")), catalog.load_table(("demo", "logs"))
    assert again.metadata is first.metadata
    other = catalog.load_table(("demo", "logs"))
    other.append(pa.table({"id": [1, 2]}))
    loaded = catalog.load_table(("demo", "logs"))
    assert loaded.metadata_location == other.metadata_location != first.metadata_location
    assert loaded.metadata is other.metadata and len(loaded.metadata.snapshots) == 1
    assert loaded.metadata == TableMetadataUtil.parse_raw(Path(loaded.metadata_location.removeprefix("file://")).read_bytes())
    assert sorted(loaded.scan().to_arrow().column("id").to_pylist()) == [1, 2]
    for value in range(private.METADATA_FILES_KEPT):
        other.append(pa.table({"id": [value]}))
    assert catalog.load_table(("demo", "logs")).metadata is other.metadata
    # The first table's file is no longer kept: a handle on it reads it again.
    from pyiceberg.serializers import FromInputFile
    assert FromInputFile.table_metadata(first.io.new_input(first.metadata_location)) is not first.metadata


def test_a_commit_shares_the_tables_history_and_leaves_every_earlier_state_as_it_was(tmp_path: Path) -> None:
    """private.share_updated_metadata, applied when a catalog is opened: a commit's new metadata
    holds the earlier snapshots and schemas themselves (pyiceberg 0.12 deep-copied the whole
    history twice a commit), and no commit changes a metadata object taken before it: appends, a
    schema change, properties set and removed, snapshots expired, each state read back equal to
    its file."""
    import pyarrow as pa
    from pyiceberg.table.metadata import TableMetadataUtil
    from pyiceberg.types import StringType

    catalog = get_catalog(f"sqlite:///{tmp_path / 'catalog.db'}", (tmp_path / "wh").as_uri())
    catalog.create_namespace("demo")
    table = catalog.create_table(("demo", "logs"), pa.schema([("id", pa.int64())]))
    states = []

    def took() -> None:
        states.append((table.metadata, table.metadata.model_dump_json()))

    table.append(pa.table({"id": [1]}))
    took()
    table.append(pa.table({"id": [2]}))
    assert table.metadata.snapshots[0] is states[0][0].snapshots[0] and table.metadata.schemas[0] is states[0][0].schemas[0]
    took()
    with table.update_schema() as update:
        update.add_column("msg", StringType())
    took()
    table.transaction().set_properties(owner="calve").commit_transaction()
    took()
    table.append(pa.table({"id": pa.array([3], pa.int64()), "msg": ["m"]}))
    took()
    table.transaction().remove_properties("owner").commit_transaction()
    with table.maintenance.expire_snapshots() as expire:
        expire.by_id(table.metadata.snapshots[0].snapshot_id)
    took()
    for metadata, dumped in states:
        assert metadata.model_dump_json() == dumped
    assert table.metadata == TableMetadataUtil.parse_raw(Path(table.metadata_location.removeprefix("file://")).read_bytes())
    assert [len(metadata.snapshots) for metadata, _ in states] == [1, 2, 2, 2, 3, 2]
    assert "owner" not in table.metadata.properties and states[3][0].properties["owner"] == "calve"
    assert sorted(catalog.load_table(("demo", "logs")).scan().to_arrow().column("id").to_pylist()) == [1, 2, 3]
