"""Tenants and their tokens in the metadata DB.

Tokens are random (256 bits), shown once, stored as SHA-256 hashes. Scopes: `ingest` (optionally
only into named pipelines), `read` (tables, rows, receipts), `admin` (the tenant's tokens and,
later, pipelines and tables). Operator tokens belong to no tenant and manage tenants.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from cachetools import TTLCache
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select

from service.core.exceptions import AlreadyExists, NotFound
from service.core.gates import LoadGates, RefreshAhead
from service.core.keys import DEFAULT_TENANT
from service.core.models import Tenant, Token, utcnow
from service.core.security import hash_token, new_token
from service.tenancy.names import validate_name

BOOTSTRAP_TOKEN_FILE = "admin-token"
TENANT_SCOPES = frozenset({"ingest", "read", "consume", "files", "admin"})
OPERATOR_SCOPE = "operator"
PREFIX_CHARS = 10


@dataclass(frozen=True)
class Principal:
    """Who a request acts as."""

    tenant: str | None  # None for an operator token
    scopes: frozenset[str]
    token_id: int
    pipelines: frozenset[str] | None = None  # ingest restricted to these, or None for all
    max_events_per_s: int | None = None
    max_bytes_per_s: int | None = None
    max_backlog_events: int | None = None
    expires_at: datetime | None = None
    landing_prefixes: tuple[str, ...] = ()  # granted through the api (CALVE_LANDING_PREFIXES adds to them)

    def expired(self, now: datetime) -> bool:
        return self.expires_at is not None and self.expires_at <= now

    @property
    def is_operator(self) -> bool:
        return OPERATOR_SCOPE in self.scopes

    def may_ingest_into(self, pipeline: str) -> bool:
        return self.pipelines is None or pipeline in self.pipelines


class PrincipalCache:
    """Recently authenticated tokens, so that a request does not cost a DB query.

    Keyed by the token's hash, never the token. Shared by the threadpool threads that run
    dependencies, hence the lock (cachetools caches are not thread-safe). `clear()` is called when
    any api or CLI announces a revocation, so a revoked token stops working at once.
    """

    def __init__(self, ttl_s: float, maxsize: int = 10_000) -> None:
        self._cache: TTLCache = TTLCache(maxsize=maxsize, ttl=ttl_s)
        self._lock = threading.Lock()
        self._gates = LoadGates()
        self._ahead = RefreshAhead(ttl_s, maxsize)

    def get(self, token: str) -> Principal | None:
        """The cached principal, if it is there and its token has not expired since."""
        with self._lock:
            principal = self._cache.get(hash_token(token))
        return None if principal is None or principal.expired(utcnow()) else principal

    def load(self, token: str, lookup: Callable[[str], Principal | None]) -> Principal | None:
        """Look the token up, one lookup per token at a time (LoadGates: each lookup also writes
        the token's last use to the DB). A clear() while it ran (an announced revocation) leaves
        its answer uncached: the DB may have been read before the revocation."""
        key = hash_token(token)
        with self._gates.one_at_a_time(key):
            cached = self.get(token)
            if cached is not None:
                return cached
            generation = self._ahead.generation
            principal = lookup(token)
            if principal is not None:
                with self._lock:
                    self._ahead.keep(self._cache, key, principal, generation)
            return principal

    def due(self, token: str) -> bool:
        """Whether the token's cached principal is past half its time and not being looked up
        again: the caller then calls refresh(), once (RefreshAhead)."""
        key = hash_token(token)
        with self._lock:
            return key in self._cache and self._ahead.due(key)

    def refresh(self, token: str, lookup: Callable[[str], Principal | None]) -> None:
        """The token looked up again: its principal kept anew, or dropped where the lookup finds
        none (revoked, expired, its tenant disabled). A clear() meanwhile (an announced
        revocation) wins: the answer of a lookup begun before it is not kept."""
        key = hash_token(token)
        generation = self._ahead.generation
        try:
            principal = lookup(token)
            with self._lock:
                if principal is not None:
                    self._ahead.keep(self._cache, key, principal, generation)
                elif generation == self._ahead.generation:
                    self._cache.pop(key, None)
        finally:
            with self._lock:
                self._ahead.done(key)

    def clear(self) -> None:
        with self._lock:
            self._cache.clear()
            self._ahead.clear()


def parse_scopes(scopes: str | list[str], allowed: frozenset[str] = TENANT_SCOPES) -> str:
    items = [s.strip() for s in (scopes.split(",") if isinstance(scopes, str) else scopes) if s.strip()]
    unknown = sorted(set(items) - allowed)
    if unknown or not items:
        raise ValueError(f"scopes must be a non-empty subset of {sorted(allowed)}; got {items}")
    return ",".join(sorted(set(items)))


def get_tenant(session: Session, name: str) -> Tenant | None:
    return session.exec(select(Tenant).where(Tenant.name == name)).first()


def tenant_id(session: Session, name: str) -> int:
    """The tenant's row id (NotFound if there is none)."""
    tenant = get_tenant(session, name)
    if tenant is None:
        raise NotFound(f"no tenant {name!r}")
    return tenant.id


def create_tenant(session: Session, name: str, **limits: int | None) -> Tenant:
    """A new tenant; `limits` are optional max_events_per_s, max_bytes_per_s, max_backlog_events."""
    validate_name("tenant", name)
    tenant = Tenant(name=name, **limits)
    session.add(tenant)
    try:
        session.commit()
    except IntegrityError as exc:
        session.rollback()
        raise AlreadyExists(f"tenant {name!r} exists already") from exc
    session.refresh(tenant)
    return tenant


def _changed(session: Session, name: str, **values: object) -> Tenant:
    """Tenant `name` with `values` set (NotFound if there is none)."""
    tenant = get_tenant(session, name)
    if tenant is None:
        raise NotFound(f"no tenant {name!r}")
    for column, value in values.items():
        setattr(tenant, column, value)
    session.add(tenant)
    session.commit()
    session.refresh(tenant)
    return tenant


def set_tenant_limits(session: Session, name: str, **limits: int | None) -> Tenant:
    """Change a tenant's limits: each one given replaces its value (None: back to the default)."""
    return _changed(session, name, **limits)


def list_tenants(session: Session) -> list[Tenant]:
    return list(session.exec(select(Tenant).order_by(Tenant.name)))


def set_tenant_disabled(session: Session, name: str, disabled: bool) -> Tenant:
    return _changed(session, name, disabled=disabled)


def issue_token(
    session: Session,
    tenant: Tenant | None,
    scopes: str = "ingest,read,admin",
    *,
    pipelines: list[str] | None = None,
    expires_in: timedelta | None = None,
    label: str = "",
    raw: str | None = None,
) -> tuple[Token, str]:
    """Create a token; returns the stored row and the raw token (shown once, never stored)."""
    if tenant is None:
        scopes = OPERATOR_SCOPE
    else:
        scopes = parse_scopes(scopes)
    for pipeline in pipelines or ():
        validate_name("pipeline", pipeline)
    raw = raw or new_token()
    token = Token(
        tenant_id=tenant.id if tenant else None,
        token_hash=hash_token(raw),
        prefix=raw[:PREFIX_CHARS],
        scopes=scopes,
        pipelines=",".join(sorted(set(pipelines))) if pipelines else None,
        expires_at=utcnow() + expires_in if expires_in else None,
        label=label,
    )
    session.add(token)
    session.commit()
    session.refresh(token)
    return token, raw


def list_tokens(session: Session, tenant: Tenant | None) -> list[Token]:
    owner = Token.tenant_id == tenant.id if tenant else Token.tenant_id.is_(None)
    return list(session.exec(select(Token).where(owner).order_by(Token.id)))


def revoke_token(session: Session, tenant: Tenant | None, token_id: int) -> Token:
    """Revoke one of `tenant`'s tokens (tenant None: an operator token). Another's is NotFound."""
    token = session.get(Token, token_id)
    owner = tenant.id if tenant else None
    if token is None or token.tenant_id != owner:
        raise NotFound(f"no token {token_id}")
    if token.revoked_at is None:
        token.revoked_at = utcnow()
        session.add(token)
        session.commit()
        session.refresh(token)
    return token


def authenticate(session: Session, raw: str) -> Principal | None:
    """The principal a raw bearer token stands for, or None if unknown, revoked, expired or disabled.

    Records the time of use (callers cache the answer, so this writes about once per cache period).
    """
    token = session.exec(select(Token).where(Token.token_hash == hash_token(raw))).first()
    now = utcnow()
    if token is None or token.revoked_at is not None or (token.expires_at is not None and token.expires_at <= now):
        return None
    tenant = session.get(Tenant, token.tenant_id) if token.tenant_id is not None else None
    if token.tenant_id is not None and (tenant is None or tenant.disabled):
        return None
    token.last_used_at = now
    session.add(token)
    session.commit()
    return Principal(
        tenant=tenant.name if tenant else None,
        scopes=frozenset(s for s in token.scopes.split(",") if s),
        token_id=token.id,
        pipelines=frozenset(token.pipelines.split(",")) if token.pipelines else None,
        max_events_per_s=tenant.max_events_per_s if tenant else None,
        max_bytes_per_s=tenant.max_bytes_per_s if tenant else None,
        max_backlog_events=tenant.max_backlog_events if tenant else None,
        expires_at=token.expires_at,
        landing_prefixes=granted_prefixes(tenant) if tenant else (),
    )


def granted_prefixes(tenant: Tenant) -> tuple[str, ...]:
    return tuple(line for line in tenant.landing_prefixes.split("\n") if line)


def set_landing_prefixes(session: Session, name: str, prefixes: list[str]) -> Tenant:
    """Replace the landing prefixes granted to tenant `name` (checked by the caller:
    registration.granted_landing_prefixes)."""
    return _changed(session, name, landing_prefixes="\n".join(prefixes))


def bootstrap(session: Session, data_dir: Path, configured_token: str | None) -> str | None:
    """Create tenant `demo` with an admin token on first start.

    Returns the generated token when Calve made one (to print once), else None. A generated token
    is also written, readable by the owner only, to `<data_dir>/admin-token`.
    """
    if get_tenant(session, DEFAULT_TENANT) is not None:
        return None
    tenant = create_tenant(session, DEFAULT_TENANT)
    _token, raw = issue_token(session, tenant, label="bootstrap", raw=configured_token)
    if configured_token:
        return None
    path = data_dir / BOOTSTRAP_TOKEN_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(raw + "\n")
    return raw


def token_expiry(text: str) -> timedelta:
    """'90d', '12h', '30m' or '45s' as a duration."""
    units = {"d": "days", "h": "hours", "m": "minutes", "s": "seconds"}
    number, unit = text[:-1], text[-1:]
    if unit not in units or not number.isdigit() or int(number) <= 0:
        raise ValueError(f"expiry {text!r}: use a positive number with d, h, m or s, e.g. 90d")
    return timedelta(**{units[unit]: int(number)})
