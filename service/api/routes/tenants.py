"""/v1/tenants: the platform operator manages tenants."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Request, status
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, BeforeValidator, Field

from service.api.deps import OperatorPrincipal, RedisDep, SessionDep, SettingsDep, TenantName
from service.api.errors import AUTH_ERRORS, error_responses
from service.core import metrics
from service.core.config import Settings
from service.core.exceptions import NotFound
from service.core.keys import AUTH_CHANNEL, backlog_key
from service.core.models import TenantPublic
from service.iceberg.registration import MAX_LANDING_PREFIXES, FileRefused, granted_landing_prefixes
from service.tenancy.names import NAME_PATTERN, RULE
from service.tenancy.tenants import (
    create_tenant,
    get_tenant,
    granted_prefixes,
    issue_token,
    list_tenants,
    set_landing_prefixes,
    set_tenant_disabled,
    set_tenant_limits,
)

router = APIRouter(prefix="/v1/tenants", tags=["tenants"], responses=error_responses(*AUTH_ERRORS))
MAX_LIMIT = 2**53


def _whole_number(value: object) -> object:
    # JSON Schema's integer includes 1757.0; a string ("40") stays a string, and is refused.
    return int(value) if isinstance(value, float) and value.is_integer() else value


# Bounded so that Redis's Lua numbers (doubles) hold them exactly.
Limit = Annotated[int, Field(gt=0, le=MAX_LIMIT, strict=True), BeforeValidator(_whole_number)]


class TenantCreate(BaseModel):
    # The pattern is declared for the document; create_tenant checks it, with a message naming the rule.
    name: str = Field(json_schema_extra={"pattern": NAME_PATTERN}, description=f"{RULE}; becomes the Iceberg namespace")
    max_events_per_s: Limit | None = None
    max_bytes_per_s: Limit | None = None
    max_backlog_events: Limit | None = None


class TenantLimits(BaseModel):
    """Each limit given replaces the tenant's own; null sets it back to the service default."""

    max_events_per_s: Limit | None = None
    max_bytes_per_s: Limit | None = None
    max_backlog_events: Limit | None = None


@router.post("", status_code=status.HTTP_201_CREATED, responses=error_responses(400, 409, 413, 422))
def add_tenant(body: TenantCreate, _operator: OperatorPrincipal, session: SessionDep) -> dict:
    tenant = create_tenant(session, **body.model_dump())
    _token, raw = issue_token(session, tenant, label="first admin")
    return {"tenant": TenantPublic.model_validate(tenant, from_attributes=True), "admin_token": raw}


@router.get("")
async def read_tenants(_operator: OperatorPrincipal, session: SessionDep, client: RedisDep) -> dict:
    """Every tenant with its limits, its backlog now (events accepted, not yet committed), and the
    events it sent and had committed since the processes started."""
    tenants = await run_in_threadpool(list_tenants, session)
    usage = await run_in_threadpool(metrics.every_tenant_totals)
    # One key per tenant, each in its tenant's slot: a pipeline, not MGET (a cluster splits it).
    async with client.pipeline(transaction=False) as pipe:
        for tenant in tenants:
            pipe.get(backlog_key(tenant.name))
        backlogs = await pipe.execute()
    return {"tenants": [
        TenantPublic.model_validate(t, from_attributes=True).model_dump() | {
            "backlog_events": max(0, int(backlog or 0)),
            # Since the processes started (the console turns them into rates between two looks).
            "received_events": int(sum(usage.get(t.name, {}).get("received", {}).values())),
            "committed_events": int(sum(usage.get(t.name, {}).get("committed", {}).values())),
        }
        for t, backlog in zip(tenants, backlogs)
    ]}


@router.patch("/{name}", responses=error_responses(400, 404, 413, 422))  # a body that is not JSON text: 400
async def change_tenant_limits(
    name: TenantName, body: TenantLimits, request: Request, _operator: OperatorPrincipal, session: SessionDep, client: RedisDep,
) -> TenantPublic:
    """Change a tenant's rate and backlog limits: this api process applies them to the next
    request, the others when they hear of it (within CALVE_AUTH_CACHE_S at worst)."""
    tenant = await run_in_threadpool(set_tenant_limits, session, name, **body.model_dump(exclude_unset=True))
    request.app.state.principals.clear()
    await client.publish(AUTH_CHANNEL, b"tenant-limits")
    return TenantPublic.model_validate(tenant, from_attributes=True)


@router.post("/{name}/disable", responses=error_responses(404, 422))
async def disable_tenant(name: TenantName, _operator: OperatorPrincipal, session: SessionDep, client: RedisDep) -> TenantPublic:
    # The database is reached from a worker thread: the event loop is not blocked meanwhile.
    tenant = await run_in_threadpool(set_tenant_disabled, session, name, True)
    await client.publish(AUTH_CHANNEL, b"tenant-disabled")
    return TenantPublic.model_validate(tenant, from_attributes=True)


@router.post("/{name}/enable", responses=error_responses(404, 422))
def enable_tenant(name: TenantName, _operator: OperatorPrincipal, session: SessionDep) -> TenantPublic:
    return TenantPublic.model_validate(set_tenant_disabled(session, name, False), from_attributes=True)


class LandingPrefixes(BaseModel):
    prefixes: list[str] = Field(
        max_length=MAX_LANDING_PREFIXES, examples=[["s3://landing/acme/"]],
        description="URIs of directories whose Parquet files the tenant may register into its tables; replaces the ones granted before",
    )


def _landing(name: str, granted: tuple[str, ...], settings: Settings) -> dict:
    return {"tenant": name, "granted": list(granted), "configured": settings.landing_prefixes.get(name, [])}


@router.get("/{name}/landing-prefixes", responses=error_responses(404, 422))
async def read_landing_prefixes(name: TenantName, _operator: OperatorPrincipal, session: SessionDep, settings: SettingsDep) -> dict:
    """The prefixes the tenant registers files from besides its tables' data locations: those
    granted here (`granted`) and those in CALVE_LANDING_PREFIXES (`configured`, read at start)."""
    tenant = await run_in_threadpool(get_tenant, session, name)
    if tenant is None:
        raise NotFound(f"no tenant {name!r}")
    return _landing(name, granted_prefixes(tenant), settings)


@router.put("/{name}/landing-prefixes", responses=error_responses(400, 404, 409, 413, 422))
async def grant_landing_prefixes(
    name: TenantName, body: LandingPrefixes, request: Request, _operator: OperatorPrincipal, session: SessionDep, client: RedisDep,
    settings: SettingsDep,
) -> dict:
    """Replace the landing prefixes granted to a tenant (an empty list takes them all back): this
    api process applies them to the next request, the others when they hear of it (within
    CALVE_AUTH_CACHE_S at worst). A prefix inside Calve's warehouse is refused (422), and so is one
    overlapping another tenant's (409): a file belongs to one tenant."""
    tenants = await run_in_threadpool(list_tenants, session)
    others = {tenant: list(prefixes) for tenant, prefixes in settings.landing_prefixes.items() if tenant != name}
    for tenant in tenants:
        if tenant.name != name:
            others.setdefault(tenant.name, []).extend(granted_prefixes(tenant))
    if not any(tenant.name == name for tenant in tenants):
        raise NotFound(f"no tenant {name!r}")
    try:
        prefixes = granted_landing_prefixes(body.prefixes, settings.resolved_warehouse(), others)
    except FileRefused as exc:
        code = status.HTTP_409_CONFLICT if exc.reason == "overlap" else status.HTTP_422_UNPROCESSABLE_ENTITY
        raise HTTPException(code, str(exc)) from exc
    tenant = await run_in_threadpool(set_landing_prefixes, session, name, prefixes)
    request.app.state.principals.clear()
    await client.publish(AUTH_CHANNEL, b"landing-prefixes")
    return _landing(name, granted_prefixes(tenant), settings)
