"""Dependencies that routes take, as Annotated aliases.

Those that only hand over what app.state holds are `async def`: FastAPI runs a plain `def`
dependency on a worker thread, a hop that cost a one-file registration call about a tenth of its
CPU (and every ingest request one hop per such dependency)."""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import logging
from collections.abc import Callable, Iterator
from typing import Annotated

import redis
import redis.asyncio as aioredis
from fastapi import Depends, HTTPException, Path, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from sqlalchemy.engine import Engine
from sqlmodel import Session

from service.api.buffer import RequestBuffer
from service.api.waiter import ReceiptWaiter
from service.core import metrics
from service.core.config import Settings
from service.core.security import TOKEN_PREFIX
from service.iceberg.catalog import load_table, open_catalog
from service.tenancy.limits import TenantLimits
from service.tenancy.names import NAME_PATTERN, RULE
from service.tenancy.tenants import OPERATOR_SCOPE, Principal, authenticate

log = logging.getLogger(__name__)
_REFRESHING: set[asyncio.Task] = set()  # (the loop keeps only weak references to its tasks)


def looked_up_again(refresh: Callable[..., None], *args: object) -> None:
    """`refresh(*args)` in the threadpool, off the request: its failure (the DB away) is logged
    and the entry then expires as it would have."""
    task = asyncio.get_running_loop().create_task(run_in_threadpool(refresh, *args))
    _REFRESHING.add(task)

    def finished(task: asyncio.Task) -> None:
        _REFRESHING.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.warning("looking up a cached token or pipeline again failed (%s); it expires as it would have", type(exc).__name__)

    task.add_done_callback(finished)


_bearer = HTTPBearer(auto_error=False)


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


SettingsDep = Annotated[Settings, Depends(get_settings)]


def get_session(request: Request) -> Iterator[Session]:
    with Session(request.app.state.engine) as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]


async def get_redis(request: Request) -> aioredis.Redis:
    return request.app.state.redis


async def get_sync_redis(request: Request) -> redis.Redis:
    return request.app.state.sync_redis


async def get_waiter(request: Request) -> ReceiptWaiter:
    return request.app.state.waiter


async def get_buffer(request: Request) -> RequestBuffer:
    return request.app.state.buffer


async def get_limits(request: Request) -> TenantLimits:
    return request.app.state.limits


async def get_iceberg(request: Request) -> Catalog:
    # Opened once per app (a SQL catalog's first open creates its tables, a REST one asks its
    # server): off the event loop then, and from app.state after.
    catalog = getattr(request.app.state, "catalog", None)
    if catalog is None:
        catalog = request.app.state.catalog = await run_in_threadpool(open_catalog, request.app.state.settings)
    return catalog


RedisDep = Annotated[aioredis.Redis, Depends(get_redis)]
SyncRedisDep = Annotated[redis.Redis, Depends(get_sync_redis)]
WaiterDep = Annotated[ReceiptWaiter, Depends(get_waiter)]
CatalogDep = Annotated[Catalog, Depends(get_iceberg)]
LimitsDep = Annotated[TenantLimits, Depends(get_limits)]
BufferDep = Annotated[RequestBuffer, Depends(get_buffer)]


def table_or_404(catalog: Catalog, tenant: str, name: str) -> Table:
    """The tenant's table `name`, or a 404 (another tenant's tables look like none)."""
    table = load_table(catalog, tenant, name)
    if table is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no table {name!r}")
    return table


def token_from(header: str | None) -> str | None:
    """The token in an Authorization header, in the forms shippers can be configured with:
    `Bearer <token>`, `ApiKey <token>` (or Elasticsearch's `ApiKey base64(id:token)`), and HTTP
    Basic with the token as the password (any user name). An ApiKey that is not base64 of
    `id:token` is the token itself, whatever its shape (an operator may choose one)."""
    scheme, _, value = (header or "").strip().partition(" ")
    scheme, value = scheme.lower(), value.strip()
    if scheme == "bearer" or (scheme == "apikey" and value.startswith(TOKEN_PREFIX)):
        return value or None
    if scheme not in ("apikey", "basic"):
        return None
    try:
        decoded = base64.b64decode(value, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        decoded = ""
    _user, colon, token = decoded.partition(":")
    if colon and token:
        return token
    return (value or None) if scheme == "apikey" else None


def lookup_principal(engine: Engine, token: str) -> Principal | None:
    """The token's principal as the metadata DB says (None: unknown, revoked, expired or its
    tenant disabled). A session of its own, closed at once: a session dependency would stay open
    until the response, and a wait=true request holds its response for up to minutes."""
    with Session(engine) as session:
        return authenticate(session, token)


async def _principal(request: Request, _credentials: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> Principal:
    # `_bearer` documents the scheme in the OpenAPI document; the header is read here, in any form.
    token = token_from(request.headers.get("authorization"))
    if token is None:
        metrics.AUTH_FAILURES.labels("missing").inc()
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "missing token: send 'Authorization: Bearer <token>' (or 'ApiKey <token>', or Basic auth with the token as the password)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    principals = request.app.state.principals
    principal = principals.get(token)
    if principal is None:
        principal = await run_in_threadpool(principals.load, token, functools.partial(lookup_principal, request.app.state.engine))
    if principal is None:
        metrics.AUTH_FAILURES.labels("unknown").inc()  # unknown, revoked, expired or its tenant disabled
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED, "unknown or revoked token", headers={"WWW-Authenticate": "Bearer"}
        )
    return principal


async def authenticated(request: Request) -> Principal:
    """The principal of the request's token, or the 401 a route requiring one answers."""
    return await _principal(request, None)


def require_scope(scope: str, *or_scopes: str):  # noqa: ANN201 - a dependency factory
    """A principal holding `scope` (or one of `or_scopes`)."""
    async def check(principal: Annotated[Principal, Depends(_principal)]) -> Principal:
        if principal.is_operator and scope != OPERATOR_SCOPE:
            raise HTTPException(
                status.HTTP_403_FORBIDDEN, "operator tokens manage tenants only; use a token of the tenant"
            )
        if not principal.scopes & {scope, *or_scopes}:
            named = " or ".join(f"'{s}'" for s in (scope, *or_scopes))
            raise HTTPException(status.HTTP_403_FORBIDDEN, f"this token lacks the {named} scope")
        return principal

    return check


IngestPrincipal = Annotated[Principal, Depends(require_scope("ingest"))]
ReadPrincipal = Annotated[Principal, Depends(require_scope("read"))]
AdminPrincipal = Annotated[Principal, Depends(require_scope("admin"))]
# A change-feed consumer's pages are read with `read` or `consume`; its cursor moves with `consume`
# (or `admin`, which creates and deletes consumers): a read-only token cannot make an application skip changes.
ConsumerReadPrincipal = Annotated[Principal, Depends(require_scope("read", "consume"))]
ConsumePrincipal = Annotated[Principal, Depends(require_scope("consume", "admin"))]
OperatorPrincipal = Annotated[Principal, Depends(require_scope(OPERATOR_SCOPE))]

TableName = Annotated[str, Path(pattern=NAME_PATTERN, description=RULE)]
# A database row id: anything outside a signed 64-bit integer is refused as 422, not sent to the DB.
RowId = Annotated[int, Path(ge=1, le=2**63 - 1)]
TenantName = Annotated[str, Path(pattern=NAME_PATTERN, description=RULE)]
