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
