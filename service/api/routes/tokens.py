"""/v1/tokens: a tenant's admin manages its tokens."""

from __future__ import annotations

from datetime import timedelta
from http import HTTPStatus
from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, status
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field

from service.api.deps import AdminPrincipal, RedisDep, RowId, SessionDep
from service.api.errors import AUTH_ERRORS, error_responses
from service.core.keys import AUTH_CHANNEL
from service.core.models import TokenPublic
from service.tenancy.names import NAME_PATTERN
from service.tenancy.tenants import (
    get_tenant,
    issue_token,
    list_tokens,
    parse_scopes,
    revoke_token,
)

router = APIRouter(prefix="/v1/tokens", tags=["tokens"], responses=error_responses(*AUTH_ERRORS))
MAX_TOKEN_LIFETIME_S = 10 * 366 * 24 * 3600


class TokenCreate(BaseModel):
    scopes: list[Literal["ingest", "read", "consume", "files", "admin"]] = Field(
        default_factory=lambda: ["ingest"], min_length=1, max_length=5, examples=[["ingest"], ["read", "admin"]]
    )
    # The pattern is declared for the document; issue_token checks it, with a message naming the rule.
    pipelines: list[Annotated[str, Field(json_schema_extra={"pattern": NAME_PATTERN})]] | None = Field(
        None, max_length=1000, description="restrict the ingest scope to these pipelines"
    )
    expires_in_s: int | None = Field(
        None, gt=0, le=MAX_TOKEN_LIFETIME_S, strict=True, description="seconds until the token stops working (at most 10 years)"
    )
    label: str = Field("", max_length=200)


class TokenCreated(TokenPublic):
    token: str = Field(description="the token itself; shown only in this answer")


@router.post("", status_code=status.HTTP_201_CREATED, responses=error_responses(400, 413, 422))
def create_token(body: TokenCreate, principal: AdminPrincipal, session: SessionDep) -> TokenCreated:
    try:
        scopes = parse_scopes(body.scopes)
    except ValueError as exc:
        raise HTTPException(HTTPStatus.UNPROCESSABLE_ENTITY, str(exc)) from exc
    tenant = get_tenant(session, principal.tenant)
    expires = timedelta(seconds=body.expires_in_s) if body.expires_in_s else None
    token, raw = issue_token(session, tenant, scopes, pipelines=body.pipelines, expires_in=expires, label=body.label)
    return TokenCreated(**TokenPublic.model_validate(token, from_attributes=True).model_dump(), token=raw)


@router.get("")
def read_tokens(principal: AdminPrincipal, session: SessionDep) -> dict:
    tokens = list_tokens(session, get_tenant(session, principal.tenant))
    return {"tokens": [TokenPublic.model_validate(t, from_attributes=True) for t in tokens]}


@router.delete("/{token_id}", responses=error_responses(404, 422))
async def delete_token(token_id: RowId, principal: AdminPrincipal, session: SessionDep, client: RedisDep) -> TokenPublic:
    # The database is reached from a worker thread: this handler is async (it publishes on Redis)
    # and must not block the event loop meanwhile.
    token = await run_in_threadpool(lambda: revoke_token(session, get_tenant(session, principal.tenant), token_id))
    # Every api process drops its cached tokens, so the revocation holds at once everywhere.
    await client.publish(AUTH_CHANNEL, b"revoked")
    return TokenPublic.model_validate(token, from_attributes=True)
