"""POST /logs: accept events into Redis, optionally wait for their commit."""

from __future__ import annotations

import uuid

import redis.asyncio as aioredis
from fastapi import APIRouter, HTTPException, Query, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from service import metrics
from service.api.deps import IngestPrincipal, LimitsDep, RedisDep, SettingsDep, WaiterDep
from service.core.config import Settings
from service.limits import TenantLimits
from service.tenants import Principal
from service.core import keys
from service.exceptions import BodyTooLarge
from service.ingest import decode_body, parse_events
from service.receipts import COMMITTED, FAILED, new_receipt_fields

router = APIRouter(tags=["ingest"])


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body, refused as soon as it passes `limit` bytes (never buffered beyond it)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"body of {declared} bytes exceeds the limit of {limit} bytes; split it into smaller requests")
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > limit:
            raise BodyTooLarge(f"body exceeds the limit of {limit} bytes; split it into smaller requests")
    return bytes(data)


@router.post(keys.DEFAULT_PIPELINE_PATH, status_code=status.HTTP_202_ACCEPTED)
async def ingest_logs(
    request: Request,
    principal: IngestPrincipal,
    client: RedisDep,
    waiter: WaiterDep,
    limits: LimitsDep,
    settings: SettingsDep,
    wait: bool = Query(False, description="answer only after the events are committed"),
    timeout: float | None = Query(None, gt=0, description="seconds to wait with wait=true (default 30)"),
) -> JSONResponse:
    tenant, pipeline = principal.tenant, keys.DEFAULT_PIPELINE
    if not principal.may_ingest_into(pipeline):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"this token may ingest only into pipelines {sorted(principal.pipelines)}, not {pipeline!r}",
        )
    try:
        raw = await read_body(request, settings.max_body_bytes)
        body = decode_body(raw, request.headers.get("content-encoding", ""), settings.max_decompressed_bytes)
        parsed = await run_in_threadpool(parse_events, body, request.headers.get("content-type", ""), settings.max_events_per_request)
    except Exception as exc:
        metrics.REQUESTS_REJECTED.labels(tenant, type(exc).__name__).inc()
        raise

    await _check_limits(limits, principal, settings, parsed.events, len(body))
    receipt_id = uuid.uuid4().hex
    try:
        await _buffer(client, tenant, pipeline, receipt_id, parsed.ndjson, parsed.events, settings.receipt_ttl_s)
    except aioredis.RedisError as exc:
        metrics.REQUESTS_REJECTED.labels(tenant, "redis_unavailable").inc()
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            "the buffer (Redis) is unavailable; nothing was accepted, retry later",
            headers={"Retry-After": "5"},
        ) from exc
    metrics.EVENTS_RECEIVED.labels(tenant, pipeline).inc(parsed.events)
    metrics.BYTES_RECEIVED.labels(tenant, pipeline).inc(len(body))

    answer = {"receipt": receipt_id, "events": parsed.events, "status": "buffered"}
    if not wait:
        return JSONResponse(answer, status_code=status.HTTP_202_ACCEPTED)
    wait_s = min(timeout or settings.wait_timeout_s, settings.max_wait_timeout_s)
    receipt = await waiter.wait(tenant, receipt_id, wait_s)
    if receipt is None or receipt.status not in (COMMITTED, FAILED):
        answer["status"] = receipt.status if receipt else "buffered"
        return JSONResponse(answer, status_code=status.HTTP_202_ACCEPTED)
    answer.update(status=receipt.status, tables=receipt.tables)
    if receipt.error:
        answer["error"] = receipt.error
    return JSONResponse(answer, status_code=status.HTTP_200_OK if receipt.status == COMMITTED else 500)


async def _check_limits(limits: TenantLimits, principal: Principal, settings: Settings, events: int, size: int) -> None:
    """Refuse early what the tenant may not add now: over its backlog cap, or over its rate."""
    tenant = principal.tenant
    cap = principal.max_backlog_events or settings.max_backlog_events
    if await limits.backlog(tenant) >= cap:
        metrics.REQUESTS_REJECTED.labels(tenant, "backlog_full").inc()
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            f"tenant {tenant!r} has {cap} or more events waiting to be written; retry later",
            headers={"Retry-After": "5"},
        )
    decision = await limits.take(
        tenant, events, size,
        principal.max_events_per_s or settings.max_events_per_s,
        principal.max_bytes_per_s or settings.max_bytes_per_s,
    )
    if not decision.allowed:
        if decision.retry_after_s == 0:
            metrics.REQUESTS_REJECTED.labels(tenant, "larger_than_burst").inc()
            raise HTTPException(status.HTTP_413_REQUEST_ENTITY_TOO_LARGE, decision.message)
        metrics.REQUESTS_REJECTED.labels(tenant, "rate_limited").inc()
        raise HTTPException(
            status.HTTP_429_TOO_MANY_REQUESTS, decision.message, headers={"Retry-After": str(decision.retry_after_s)}
        )


async def _buffer(
    client: aioredis.Redis, tenant: str, pipeline: str, receipt_id: str, ndjson: bytes, events: int, ttl_s: int
) -> None:
    """Receipt and input entry in one transaction: a 202 always has both."""
    receipt = keys.receipt_key(tenant, receipt_id)
    async with client.pipeline(transaction=True) as pipe:
        pipe.hset(receipt, mapping=new_receipt_fields(events, pipeline))
        pipe.expire(receipt, ttl_s)
        pipe.incrby(keys.backlog_key(tenant), events)
        pipe.xadd(
            keys.input_stream_key(tenant, pipeline),
            {keys.F_RECEIPT: receipt_id, keys.F_EVENTS: str(events), keys.F_BODY: ndjson},
        )
        await pipe.execute()
    # Outside the transaction: the registry lives in no tenant's slot, and adding twice is harmless.
    await client.sadd(keys.INPUT_STREAMS, keys.member(tenant, pipeline))
