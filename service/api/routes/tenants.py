"""/v1/tenants: the platform operator manages tenants."""

from __future__ import annotations

from fastapi import APIRouter, status
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field

from service.api.deps import OperatorPrincipal, RedisDep, SessionDep, TenantName
from service.api.errors import AUTH_ERRORS, error_responses
from service.core.keys import AUTH_CHANNEL
from service.core.models import TenantPublic
from service.tenancy.names import NAME_PATTERN, RULE
from service.tenancy.tenants import (
    create_tenant,
    issue_token,
    list_tenants,
    set_tenant_disabled,
)

router = APIRouter(prefix="/v1/tenants", tags=["tenants"], responses=error_responses(*AUTH_ERRORS))
MAX_LIMIT = 2**53


class TenantCreate(BaseModel):
    # The pattern is declared for the document; create_tenant checks it, with a message naming the rule.
    name: str = Field(json_schema_extra={"pattern": NAME_PATTERN}, description=f"{RULE}; becomes the Iceberg namespace")
    # Bounded so that Redis's Lua numbers (doubles) hold them exactly.
    max_events_per_s: int | None = Field(None, gt=0, le=MAX_LIMIT, strict=True)
    max_bytes_per_s: int | None = Field(None, gt=0, le=MAX_LIMIT, strict=True)
    max_backlog_events: int | None = Field(None, gt=0, le=MAX_LIMIT, strict=True)


@router.post("", status_code=status.HTTP_201_CREATED, responses=error_responses(400, 409, 413, 422))
def add_tenant(body: TenantCreate, _operator: OperatorPrincipal, session: SessionDep) -> dict:
    tenant = create_tenant(session, **body.model_dump())
    _token, raw = issue_token(session, tenant, label="first admin")
    return {"tenant": TenantPublic.model_validate(tenant, from_attributes=True), "admin_token": raw}


@router.get("")
def read_tenants(_operator: OperatorPrincipal, session: SessionDep) -> dict:
    return {"tenants": [TenantPublic.model_validate(t, from_attributes=True) for t in list_tenants(session)]}


@router.post("/{name}/disable", responses=error_responses(404, 422))
async def disable_tenant(name: TenantName, _operator: OperatorPrincipal, session: SessionDep, client: RedisDep) -> TenantPublic:
    # The database is reached from a worker thread: the event loop is not blocked meanwhile.
    tenant = await run_in_threadpool(set_tenant_disabled, session, name, True)
    await client.publish(AUTH_CHANNEL, b"tenant-disabled")
    return TenantPublic.model_validate(tenant, from_attributes=True)


@router.post("/{name}/enable", responses=error_responses(404, 422))
def enable_tenant(name: TenantName, _operator: OperatorPrincipal, session: SessionDep) -> TenantPublic:
    return TenantPublic.model_validate(set_tenant_disabled(session, name, False), from_attributes=True)
