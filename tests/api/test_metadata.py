"""Metadata DB: migrations from empty, tenants and tokens, on SQLite and PostgreSQL."""

from __future__ import annotations

import stat
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import inspect, text
from sqlmodel import Session, select

from service.core.db import get_engine, migrate
from service.core.exceptions import AlreadyExists, InvalidName, NotFound
from service.core.models import Token
from service.core.security import hash_token
from service.tenancy.tenants import (
    BOOTSTRAP_TOKEN_FILE,
    authenticate,
    bootstrap,
    create_tenant,
    issue_token,
    revoke_token,
    set_tenant_disabled,
    token_expiry,
)


def test_migrations_create_the_schema_from_empty(metadata_url: str) -> None:
    migrate(metadata_url)
    migrate(metadata_url)  # a second start is a no-op
    inspector = inspect(get_engine(metadata_url))
    assert {"tenant", "token", "pipeline", "pipelineversion", "changeconsumer", "alembic_version"} <= set(inspector.get_table_names())
    assert {"expires_at", "last_used_at", "pipelines", "prefix"} <= {c["name"] for c in inspector.get_columns("token")}
    assert "landing_prefixes" in {c["name"] for c in inspector.get_columns("tenant")}
    with get_engine(metadata_url).connect() as connection:
        assert connection.execute(text("SELECT version_num FROM alembic_version")).scalar() == "0006"


def test_generated_bootstrap_token_is_shown_once_stored_hashed_and_private(metadata_url: str, tmp_path: Path) -> None:
    migrate(metadata_url)
    with Session(get_engine(metadata_url)) as session:
        token = bootstrap(session, tmp_path, None)
        assert token and token.startswith("calve_") and len(token) >= 43
        assert bootstrap(session, tmp_path, None) is None, "second start creates nothing"
        stored = session.exec(select(Token)).one()
        assert stored.token_hash == hash_token(token)
        assert token not in (stored.token_hash, stored.prefix, stored.label)
        assert authenticate(session, token).tenant == "demo"
        assert authenticate(session, token + "x") is None
    path = tmp_path / BOOTSTRAP_TOKEN_FILE
    assert path.read_text().strip() == token
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    if metadata_url.startswith("sqlite"):
        assert token.encode() not in Path(metadata_url.removeprefix("sqlite:///")).read_bytes()


def test_configured_bootstrap_token_is_not_written_to_disk(metadata_url: str, tmp_path: Path) -> None:
    migrate(metadata_url)
    with Session(get_engine(metadata_url)) as session:
        assert bootstrap(session, tmp_path, "calve_configured-token-value") is None
        assert authenticate(session, "calve_configured-token-value").scopes == {"ingest", "read", "admin"}
    assert not (tmp_path / BOOTSTRAP_TOKEN_FILE).exists()


def test_tokens_expire_revoke_record_use_and_follow_their_tenant(metadata_url: str) -> None:
    migrate(metadata_url)
    with Session(get_engine(metadata_url)) as session:
        acme = create_tenant(session, "acme")
        with pytest.raises(AlreadyExists):
            create_tenant(session, "acme")
        _row, live = issue_token(session, acme, "ingest", pipelines=["logs"], expires_in=timedelta(days=1))
        _row, dead = issue_token(session, acme, "read", expires_in=timedelta(seconds=-1))
        principal = authenticate(session, live)
        assert principal.scopes == {"ingest"} and principal.pipelines == {"logs"}
        assert principal.may_ingest_into("logs") and not principal.may_ingest_into("audit")
        assert session.get(Token, principal.token_id).last_used_at is not None
        assert authenticate(session, dead) is None, "expired"

        other = create_tenant(session, "other")
        with pytest.raises(NotFound):
            revoke_token(session, other, principal.token_id)  # another tenant's token looks absent
        revoke_token(session, acme, principal.token_id)
        assert authenticate(session, live) is None, "revoked"

        _row, again = issue_token(session, acme, "read")
        set_tenant_disabled(session, "acme", True)
        assert authenticate(session, again) is None, "tenant disabled"
        set_tenant_disabled(session, "acme", False)
        assert authenticate(session, again) is not None

        _row, operator = issue_token(session, None)
        assert authenticate(session, operator).is_operator and authenticate(session, operator).tenant is None


@pytest.mark.parametrize("name", ["", "A", "1abc", "a-b", "a.b", "a/b", "../etc", "a{b}", "a:b", "x" * 64, "ä"])
def test_hostile_tenant_names_are_refused(metadata_url: str, name: str) -> None:
    migrate(metadata_url)
    with Session(get_engine(metadata_url)) as session, pytest.raises(InvalidName, match="invalid tenant name"):
        create_tenant(session, name)


def test_token_expiry_parsing() -> None:
    assert token_expiry("90d") == timedelta(days=90)
    assert token_expiry("30m") == timedelta(minutes=30)
    for bad in ("", "5", "0d", "-1d", "1w", "d"):
        with pytest.raises(ValueError):
            token_expiry(bad)


def test_migrations_match_the_models(metadata_url: str) -> None:
    """A model changed without a migration (or the reverse) shows up here, on both backends."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    from sqlmodel import SQLModel

    import service.core.models  # noqa: F401 - registers the tables on SQLModel.metadata

    migrate(metadata_url)
    with get_engine(metadata_url).connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection, opts={"compare_type": False}), SQLModel.metadata)
    assert [d for d in differences if d[0] != "remove_table" or d[1].name != "alembic_version"] == []
