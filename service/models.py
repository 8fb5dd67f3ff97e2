"""Metadata DB entities (SQLModel). Tokens are stored only as SHA-256 hashes."""

from __future__ import annotations

from datetime import datetime, timezone

from sqlmodel import Field, SQLModel


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class TenantBase(SQLModel):
    name: str = Field(index=True, unique=True, max_length=63)


class Tenant(TenantBase, table=True):
    id: int | None = Field(default=None, primary_key=True)
    disabled: bool = False
    created_at: datetime = Field(default_factory=utcnow)


class TokenBase(SQLModel):
    tenant_id: int = Field(foreign_key="tenant.id", index=True)
    scopes: str = "ingest,read,admin"  # comma-separated
    label: str = ""


class Token(TokenBase, table=True):
    id: int | None = Field(default=None, primary_key=True)
    token_hash: str = Field(index=True, unique=True, max_length=64)
    created_at: datetime = Field(default_factory=utcnow)
    revoked_at: datetime | None = None
