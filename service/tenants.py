"""Tenants and their tokens in the metadata DB."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

from cachetools import TTLCache
from sqlmodel import Session, select

from service.core.keys import DEFAULT_TENANT
from service.core.security import hash_token, new_token
from service.models import Tenant, Token

BOOTSTRAP_TOKEN_FILE = "admin-token"


@dataclass(frozen=True)
class Principal:
    """Who a request acts as."""

    tenant: str
    scopes: frozenset[str]


class PrincipalCache:
    """Recently authenticated tokens, so that a request does not cost a DB query.

    Keyed by the token's hash, never the token. Shared by the threadpool threads that run
    dependencies, hence the lock (cachetools caches are not thread-safe).
    """

    def __init__(self, ttl_s: float, maxsize: int = 10_000) -> None:
        self._cache: TTLCache = TTLCache(maxsize=maxsize, ttl=ttl_s)
        self._lock = threading.Lock()

    def get(self, token: str) -> Principal | None:
        with self._lock:
            return self._cache.get(hash_token(token))

    def put(self, token: str, principal: Principal) -> None:
        with self._lock:
            self._cache[hash_token(token)] = principal


def create_tenant(session: Session, name: str) -> Tenant:
    tenant = Tenant(name=name)
    session.add(tenant)
    session.commit()
    session.refresh(tenant)
    return tenant


def add_token(session: Session, tenant: Tenant, token: str, scopes: str = "ingest,read,admin", label: str = "") -> None:
    session.add(Token(tenant_id=tenant.id, token_hash=hash_token(token), scopes=scopes, label=label))
    session.commit()


def authenticate(session: Session, token: str) -> Principal | None:
    """The principal a raw bearer token stands for, or None if it is unknown, revoked or disabled."""
    row = session.exec(
        select(Token, Tenant).join(Tenant).where(Token.token_hash == hash_token(token))
    ).first()
    if row is None:
        return None
    stored, tenant = row
    if stored.revoked_at is not None or tenant.disabled:
        return None
    return Principal(tenant=tenant.name, scopes=frozenset(s for s in stored.scopes.split(",") if s))


def bootstrap(session: Session, data_dir: Path, configured_token: str | None) -> str | None:
    """Create tenant `demo` with an admin token on first start.

    Returns the generated token when Calve made one (to print once), else None. A generated token
    is also written, readable by the owner only, to `<data_dir>/admin-token`.
    """
    if session.exec(select(Tenant).where(Tenant.name == DEFAULT_TENANT)).first() is not None:
        return None
    tenant = create_tenant(session, DEFAULT_TENANT)
    token = configured_token or new_token()
    add_token(session, tenant, token, label="bootstrap")
    if configured_token:
        return None
    path = data_dir / BOOTSTRAP_TOKEN_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
    return token
