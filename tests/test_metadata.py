"""Metadata DB: migrations from empty, bootstrap tenant and token."""

from __future__ import annotations

import stat
from pathlib import Path

from sqlalchemy import inspect
from sqlmodel import Session, select

from service.core.db import get_engine, migrate
from service.core.security import hash_token
from service.models import Token
from service.tenants import BOOTSTRAP_TOKEN_FILE, authenticate, bootstrap


def test_migrations_create_the_schema_from_empty(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'meta.db'}"
    migrate(url)
    migrate(url)  # a second start is a no-op
    tables = set(inspect(get_engine(url)).get_table_names())
    assert {"tenant", "token", "alembic_version"} <= tables


def test_generated_bootstrap_token_is_shown_once_stored_hashed_and_private(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'meta.db'}"
    migrate(url)
    with Session(get_engine(url)) as session:
        token = bootstrap(session, tmp_path, None)
        assert token and token.startswith("calve_") and len(token) >= 43
        assert bootstrap(session, tmp_path, None) is None, "second start creates nothing"
        stored = session.exec(select(Token)).one()
        assert stored.token_hash == hash_token(token)
        assert authenticate(session, token).tenant == "demo"
        assert authenticate(session, token + "x") is None
    path = tmp_path / BOOTSTRAP_TOKEN_FILE
    assert path.read_text().strip() == token
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert token.encode() not in (tmp_path / "meta.db").read_bytes()


def test_configured_bootstrap_token_is_not_written_to_disk(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'meta.db'}"
    migrate(url)
    with Session(get_engine(url)) as session:
        assert bootstrap(session, tmp_path, "calve_configured-token-value") is None
        assert authenticate(session, "calve_configured-token-value").scopes == {"ingest", "read", "admin"}
    assert not (tmp_path / BOOTSTRAP_TOKEN_FILE).exists()
