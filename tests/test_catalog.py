"""The catalog as several processes meet it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from pyiceberg.catalog.sql import SqlCatalog
from sqlalchemy.exc import OperationalError

from service import catalog as catalog_module
from service.catalog import get_catalog


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

    from service.catalog import create_table_once

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
