"""Metadata DB entities (SQLModel). Tokens are stored only as SHA-256 hashes."""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import Index, UniqueConstraint
from sqlmodel import Field, SQLModel


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class TenantBase(SQLModel):
    name: str = Field(index=True, unique=True, max_length=63)
    # Per-tenant overrides of the deployment's defaults (None: use the default).
    max_events_per_s: int | None = None
    max_bytes_per_s: int | None = None
    max_backlog_events: int | None = None


class Tenant(TenantBase, table=True):
    id: int | None = Field(default=None, primary_key=True)
    disabled: bool = False
    # The prefixes an operator granted it to register files written elsewhere from, one per line
    # (PUT /v1/tenants/{name}/landing-prefixes; a URI holds no line break).
    landing_prefixes: str = ""
    created_at: datetime = Field(default_factory=utcnow)


class TenantPublic(TenantBase):
    disabled: bool
    created_at: datetime


class TokenBase(SQLModel):
    scopes: str = "ingest,read,admin"  # comma-separated
    pipelines: str | None = None  # comma-separated; restricts the ingest scope
    label: str = ""
    expires_at: datetime | None = None


class Token(TokenBase, table=True):
    id: int | None = Field(default=None, primary_key=True)
    tenant_id: int | None = Field(default=None, foreign_key="tenant.id", index=True)  # None: operator
    token_hash: str = Field(index=True, unique=True, max_length=64)
    prefix: str = ""  # the first characters, to tell tokens apart in listings
    created_at: datetime = Field(default_factory=utcnow)
    revoked_at: datetime | None = None
    last_used_at: datetime | None = None


class TokenPublic(TokenBase):
    id: int
    prefix: str
    created_at: datetime
    revoked_at: datetime | None
    last_used_at: datetime | None


class Pipeline(SQLModel, table=True):
    """A tenant's pipeline; its definitions are the versions. A deleted one keeps its versions
    (the writer may still hold buffered requests for it) and gives up its path."""

    __table_args__ = (
        UniqueConstraint("tenant_id", "name"), UniqueConstraint("tenant_id", "path"),
        Index("ix_pipeline_tenant_source_table", "tenant_id", "source_table"),
    )

    id: int | None = Field(default=None, primary_key=True)
    tenant_id: int = Field(foreign_key="tenant.id", index=True)
    name: str = Field(max_length=63)
    path: str | None = Field(default=None, max_length=200)  # None once deleted
    source_table: str | None = Field(default=None, max_length=63)  # the current version's source.table
    version: int = 1  # the current version
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)
    deleted_at: datetime | None = None


class PipelineVersion(SQLModel, table=True):
    __table_args__ = (UniqueConstraint("pipeline_id", "version"),)

    id: int | None = Field(default=None, primary_key=True)
    pipeline_id: int = Field(foreign_key="pipeline.id", index=True)
    version: int
    definition: str  # JSON, as validated
    created_at: datetime = Field(default_factory=utcnow)


# The consumer through which a pipeline fed by a table reads the table's changes: this + its name.
PIPELINE_CONSUMER_PREFIX = "pipeline:"


class ChangeConsumer(SQLModel, table=True):
    """A resumable reader of one table's change feed. `cursor` is where it has acknowledged
    (service/feeds/cursors.py); the snapshots from there on are kept by snapshot expiry while it
    is not `lagging_since`."""

    __table_args__ = (UniqueConstraint("tenant_id", "table_name", "name"),)

    id: int | None = Field(default=None, primary_key=True)
    tenant_id: int = Field(foreign_key="tenant.id", index=True)
    table_name: str = Field(max_length=63)
    name: str = Field(max_length=80)  # a user's name, or pipeline:<name> for a pipeline fed by the table
    cursor: str = Field(max_length=200)
    start: str = Field(max_length=40)  # as asked: earliest, latest or a snapshot id
    initial_load: bool = False
    created_at: datetime = Field(default_factory=utcnow)
    acked_at: datetime | None = None
    lagging_since: datetime | None = None
