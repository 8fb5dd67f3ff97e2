"""POST /<pipeline path> (/logs and the paths of the tenant's pipelines): accept events into Redis,
optionally wait for their commit."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import re
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from http import HTTPStatus

import redis.asyncio as aioredis
from fastapi import APIRouter, HTTPException, Query, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sqlalchemy.engine import Engine
from sqlmodel import Session
from starlette.convertors import Convertor, register_url_convertor

from service.api.bodies import parsed_off_loop, read_body
from service.api.buffer import RequestBuffer
from service.api.deps import (
    IngestPrincipal,
)
from service.api.errors import AUTH_ERRORS, error_responses, method_not_allowed
from service.api.events import ParsedBody, decode_body, events_at_least, made_events, parse_events
from service.api.waiter import ReceiptWaiter
from service.core import metrics
from service.core.config import Settings
from service.pipelines.spec import PATH_PATTERN, RESERVED_PATH_PREFIXES, is_reserved_path
from service.pipelines.store import MISSING, PipelineRecord, find_by_path
from service.protocol.receipts import COMMITTED, FAILED
from service.protocol.scripts import BACKLOG_FULL
from service.tenancy.limits import ALLOWED, Charge, OverLimits, TenantLimits
from service.tenancy.tenants import Principal

BACKLOG_RETRY_S = 5  # Retry-After of a request over its tenant's backlog cap

router = APIRouter(tags=["ingest"])
# The api tries its routes in order, and this router's catch-all comes last (it takes POST on any
# path that is not Calve's own): each ingest request was matched against every route first, ~100
# microseconds of the api's ~2.1 ms of CPU a plain 1,000-event request. A POST to a path a
# pipeline may have, which no route of Calve's own can match, is matched first, by this router
# (service/api/main.py includes it first); the catch-all still takes what it does not.
pipeline_router = APIRouter(tags=["ingest"])


class PipelinePath(Convertor):
    """A path a pipeline may have (PATH_PATTERN, without its leading slash) and that is not Calve's
    own (is_reserved_path)."""

    regex = (
        "(?!(?:" + "|".join(re.escape(prefix.lstrip("/")) for prefix in RESERVED_PATH_PREFIXES) + ")(?:/|$))"
        "(?![a-z0-9_\\-]+/(?:_bulk|_doc|_create)(?:/|$))"  # Elasticsearch's document APIs under an index
        "[a-z0-9_\\-]+(?:/[a-z0-9_\\-]+)*"
    )

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("pipeline_path", PipelinePath())
ROUTED = metrics.INGEST_WAYS.labels("routed")  # (the known ones: service/api/fast_ingest.py)
MAX_IDEMPOTENCY_KEY = 255
EVENTS_BODY = {
    "requestBody": {
        "required": True,
        "description": "one event (a JSON object), a JSON array of events, or NDJSON (one event per line); "
                       "Content-Encoding: gzip is accepted",
        "content": {
            "application/json": {"schema": {"oneOf": [{"type": "object"}, {"type": "array", "items": {"type": "object"}}]}},
            "application/x-ndjson": {"schema": {"type": "string"}},
        },
    }
}


class IngestAnswer(BaseModel):
    receipt: str
    events: int
    status: str = Field(description="buffered (202), committed (200) or failed (500)")
    tables: dict[str, dict] | None = Field(None, description=(
        "with wait=true: per table, rows, snapshot_id, dropped_fields (fields no column took) and nulled_fields (columns where a value "
        "could not be converted and is NULL)"))
    dlq_events: int | None = Field(None, description="with wait=true: events that went to the DLQ")
    detail: str | None = Field(None, description="failed: why the events could not be committed")


@pipeline_router.post("/{path:pipeline_path}", status_code=status.HTTP_202_ACCEPTED, response_model=IngestAnswer, include_in_schema=False)
@router.post(
    "/{path:path}", status_code=status.HTTP_202_ACCEPTED, response_model=IngestAnswer, openapi_extra=EVENTS_BODY,
    responses={
        200: {"model": IngestAnswer, "description": "with wait=true: every event is committed (or in the DLQ)"},
        500: {"model": IngestAnswer, "description": "with wait=true: a commit of the events can never succeed (detail says why)"},
        **error_responses(*AUTH_ERRORS, 400, 404, 405, 408, 413, 422, 429, 503),
    },
)
async def ingest(
    path: str,
    request: Request,
    principal: IngestPrincipal,
    wait: bool = Query(False, description="answer only after the events are committed"),
    timeout: float | None = Query(None, gt=0, le=86400, description="seconds to wait with wait=true (default 30)"),
) -> JSONResponse:
    ROUTED.inc()
    refuse_while_draining(request)
    pipeline = await _pipeline_at(request, principal.tenant, "/" + path)
    # The app's parts from its state, not as dependencies: FastAPI's solving of each costs every
    # request (four of them were ~a tenth of the api's CPU for a request of 20 events).
    state = request.app.state
    with in_flight(request):
        return await _ingest(request, principal, pipeline, state.buffer, state.waiter, state.limits, state.settings, wait, timeout)


def refuse_while_draining(request: Request, headers: dict[str, str] | None = None) -> None:
    if request.app.state.draining:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            "this api process is shutting down; nothing was accepted, retry (another replica will take it)",
            headers={"Retry-After": "1", **(headers or {})},
        )


@contextlib.contextmanager
def counted_refusals(tenant: str) -> Iterator[None]:
    """A request refused by what it sent (its body, its headers) is counted by the refusal's kind."""
    try:
        yield
    except Exception as exc:
        metrics.REQUESTS_REJECTED.labels(tenant, metrics.reason_label(type(exc).__name__)).inc()
        raise


@contextlib.contextmanager
def in_flight(request: Request) -> Iterator[None]:
    """Counts the request among those a draining api waits for."""
    state = request.app.state
    state.in_flight += 1
    try:
        yield
    finally:
        state.in_flight -= 1


@router.api_route("/{path:path}", methods=["GET", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "TRACE"], include_in_schema=False)
async def no_such_endpoint(path: str, request: Request) -> None:
    # Without this, the POST catch-all above would make every unknown path a 405; a known path
    # asked with a method it lacks is a 405 naming the methods it has.
    raise method_not_allowed(request) or HTTPException(status.HTTP_404_NOT_FOUND, f"no such endpoint: /{path[:200]}")


def pipeline_at(engine: Engine, tenant: str, path: str) -> PipelineRecord | None:
    """The tenant's pipeline at `path` as the metadata DB says (None: none there)."""
    with Session(engine) as session:
        return find_by_path(session, tenant, path)


async def _pipeline_at(request: Request, tenant: str, path: str) -> str:
    """The name of the tenant's pipeline at `path`, or 404 saying how to find the right one."""
    if is_reserved_path(path) and (wrong_method := method_not_allowed(request)):
        raise wrong_method
    record = None
    if PATH_PATTERN.fullmatch(path) and not is_reserved_path(path):
        pipelines = request.app.state.pipelines
        record = pipelines.cached((tenant, path))
        if record is MISSING:  # the database is asked off the loop
            record = await run_in_threadpool(pipelines.get, (tenant, path), functools.partial(pipeline_at, request.app.state.engine, tenant, path))
    if record is None and is_reserved_path(path):
        # Calve's own prefixes (/v1, /otlp, /loki, ...) hold no pipelines: a typo of an API route.
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no such endpoint: POST {path[:200]}; /docs lists the API's routes")
    if record is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND, f"no pipeline of tenant {tenant!r} at {path[:200]}; GET /v1/pipelines lists them and their paths"
        )
    return record.name


async def _ingest(
    request: Request, principal: Principal, pipeline: str, buffer: RequestBuffer, waiter: ReceiptWaiter,
    limits: TenantLimits, settings: Settings, wait: bool, timeout: float | None,
) -> JSONResponse:
    tenant = principal.tenant
    idempotency = idempotency_digest(request.headers.get("idempotency-key"))
    if not principal.may_ingest_into(pipeline):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"this token may ingest only into pipelines {sorted(principal.pipelines)}, not {pipeline!r}",
        )
    content_type = request.headers.get("content-type", "")
    with counted_refusals(tenant):
        raw = await read_body(request, settings.max_body_bytes)
        body = decode_body(raw, request.headers.get("content-encoding", ""), settings.max_decompressed_bytes)
    async with looked_at(limits, principal, settings, idempotency, lambda: events_at_least(body, content_type), len(body)):
        with counted_refusals(tenant):
            parsed = await parsed_off_loop(tenant, len(body), parse_events, body, content_type, settings.max_events_per_request)
        receipt_id, replay = await accept(buffer, limits, principal, settings, pipeline, parsed, idempotency, len(body))
    return await _answer(waiter, tenant, receipt_id, parsed.events, wait, timeout, settings, replay=replay)


async def accept_converted(
    request: Request, principal: Principal, buffer: RequestBuffer, limits: TenantLimits, settings: Settings, pipeline: str,
    convert: Callable[[bytes], Iterable[dict] | ParsedBody | None], inline_below: int = 0,
) -> str | None:
    """A shipper's protocol request: its body (within the limits, gunzipped) turned into events by
    `convert` (off the event loop, but for a body of fewer than `inline_below` bytes, whose
    conversion is cheaper than the trip to the parsing thread; BadRequestBody when it cannot; or
    into the writer's lines, which it checked as made_events does; None for no event), then
    buffered as one request of `pipeline` like a POST to its path. Its receipt; None if it held
    no event."""
    refuse_while_draining(request)
    tenant = principal.tenant
    if not principal.may_ingest_into(pipeline):
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"this token may not ingest into pipeline {pipeline!r}")
    idempotency = idempotency_digest(request.headers.get("idempotency-key"))
    with counted_refusals(tenant):
        raw = await read_body(request, settings.max_body_bytes)
        body = decode_body(raw, request.headers.get("content-encoding", ""), settings.max_decompressed_bytes)
    # (One event at least: an export that holds none is refused with the rest while its tenant is over.)
    async with looked_at(limits, principal, settings, idempotency, 1, len(body)):
        with counted_refusals(tenant):
            # A shipper's body costs several times a plain one's per byte to convert (OTLP: ~10 ms per
            # 1,000 records): on the loop it held every other request up (make bench's otlp: 0.40x
            # plain against 0.47x in a thread). One thread, not the pool: pyarrow's compute calls let
            # go of the GIL, and forty threads taking it back in turn doubled the api's CPU per OTLP
            # export (make bench-api: 23 against 10 ms per 1,000 records).
            # Below `inline_below` whatever the company (a tenant converting its exports is company
            # for another's flood of plain bodies all the same).
            parsed = await parsed_off_loop(tenant, len(body), lambda: _made(convert(body), settings.max_events_per_request),
                                           alone_upto=inline_below - 1, shared_upto=inline_below - 1)
        if parsed is None:
            return None
        with in_flight(request):
            receipt_id, _replay = await accept(buffer, limits, principal, settings, pipeline, parsed, idempotency, len(body))
    return receipt_id


def _made(converted: Iterable[dict] | ParsedBody | None, max_events: int) -> ParsedBody | None:
    return converted if converted is None or isinstance(converted, ParsedBody) else made_events(converted, max_events)


async def accept(
    buffer: RequestBuffer, limits: TenantLimits, principal: Principal, settings: Settings, pipeline: str,
    parsed: ParsedBody, idempotency: str | None, size: int,
) -> tuple[str, bool]:
    """Buffer a request's events, within the tenant's limits and once per idempotency key: its
    receipt, and whether it is the first request's (this one being a retry of it). A retry of a
    request already accepted is answered with the first one's receipt: no limits charged, nothing
    buffered. All in one step (one round trip to Redis)."""
    tenant = principal.tenant
    receipt_id = uuid.uuid4().hex
    charge = charge_of(principal, settings, parsed.events, size)
    try:
        first = await buffer.add(tenant, pipeline, receipt_id, parsed, idempotency, limits=limits.checked_in_buffer(charge))
    except OverLimits as over:
        raise refusal(limits, charge, over.verdict, over.detail) from None
    except aioredis.RedisError as exc:
        metrics.REQUESTS_REJECTED.labels(tenant, "redis_unavailable").inc()
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            "the buffer (Redis) is unavailable; nothing was accepted, retry later",
            headers={"Retry-After": "5"},
        ) from exc
    if first:
        return first, True
    metrics.EVENTS_RECEIVED.labels(tenant, pipeline).inc(parsed.events)
    metrics.BYTES_RECEIVED.labels(tenant, pipeline).inc(size)
    return receipt_id, False


async def _answer(
    waiter: ReceiptWaiter, tenant: str, receipt_id: str, events: int, wait: bool, timeout: float | None,
    settings: Settings, replay: bool = False,
) -> JSONResponse:
    """202 with the receipt, or with wait=true the receipt once committed (200)."""
    answer: dict = {"receipt": receipt_id, "events": events, "status": "buffered"}
    headers = {"Idempotent-Replay": "true"} if replay else None
    wait_s = min(timeout or settings.wait_timeout_s, settings.max_wait_timeout_s) if wait else 0
    receipt = await waiter.wait(tenant, receipt_id, wait_s, fresh=not replay) if (wait or replay) else None
    if receipt is not None:
        answer.update(events=receipt.events, status=receipt.status)
    if receipt is None or receipt.status not in (COMMITTED, FAILED):
        return JSONResponse(answer, status_code=status.HTTP_202_ACCEPTED, headers=headers)
    answer["tables"] = receipt.tables
    answer["dlq_events"] = receipt.public()["dlq_events"]
    if receipt.status == FAILED:
        answer["detail"] = receipt.error
        return JSONResponse(answer, status_code=status.HTTP_500_INTERNAL_SERVER_ERROR, headers=headers)
    return JSONResponse(answer, status_code=status.HTTP_200_OK, headers=headers)


def charge_of(principal: Principal, settings: Settings, events: int, size: int) -> Charge:
    return Charge(
        principal.tenant, events, size, principal.max_backlog_events or settings.max_backlog_events,
        principal.max_events_per_s or settings.max_events_per_s, principal.max_bytes_per_s or settings.max_bytes_per_s,
    )


async def check_limits(limits: TenantLimits, principal: Principal, settings: Settings, events: int, size: int) -> None:
    """Refuse early what the tenant may not add now: over its backlog cap, or over its rate (and
    charge the rate). For a body buffered in several steps; accept() checks within its one."""
    charge = charge_of(principal, settings, events, size)
    if await limits.backlog(charge.tenant) >= charge.backlog_cap:
        raise refusal(limits, charge, BACKLOG_FULL, 0)
    verdict, detail = await limits.take(charge)
    if verdict != ALLOWED:
        raise refusal(limits, charge, verdict, detail)


def looked_at(
    limits: TenantLimits, principal: Principal, settings: Settings, idempotency: str | None,
    events: int | Callable[[], int], size: int,
) -> contextlib.AbstractAsyncContextManager[None]:
    """While its tenant was refused lately, a request refused as it would be once read, before its
    body is read: from the least it holds, `events` events (counted only then, when a callable)
    and `size` bytes (TenantLimits.refused_early). A tenant over its limits costs the api a look
    in Redis per request, not a parse. A look charges nothing: when the rate refilled for one
    request, every request in flight passed it, each was parsed, and all but the first were
    refused once parsed. So a request that passes looks again in its tenant's turn
    (TenantLimits.one_at_a_time), after the requests that passed before it were read and
    charged, and reads and buffers its body inside this block. Redis unreachable: the request
    goes on, to the buffering step's 503. A tenant not refused lately pays one dict lookup (no
    generator made per request: ~1.5 us, on every request's path)."""
    if not limits.refused_lately(principal.tenant):
        return _NOT_LOOKED_AT
    return _looked_at(limits, principal, settings, idempotency, events, size)


_NOT_LOOKED_AT = contextlib.nullcontext()


@contextlib.asynccontextmanager
async def _looked_at(
    limits: TenantLimits, principal: Principal, settings: Settings, idempotency: str | None,
    events: int | Callable[[], int], size: int,
) -> AsyncIterator[None]:
    charge = charge_of(principal, settings, events if isinstance(events, int) else events(), size)

    async def look() -> tuple[int, int] | None:
        try:
            return await limits.refused_early(charge, idempotency)
        except aioredis.RedisError:
            return None

    if (found := await look()) is None:
        async with limits.one_at_a_time(principal.tenant):
            if (found := await look()) is None:
                yield
                return
    raise refusal(limits, charge, *found)


def refusal(limits: TenantLimits, charge: Charge, verdict: int, detail: int) -> HTTPException:
    """The answer to a request over its tenant's backlog cap (503) or rate (429, or 413 when it is
    larger than the tenant's burst), counted."""
    tenant = charge.tenant
    if verdict == BACKLOG_FULL:
        limits.note_refused(tenant, BACKLOG_RETRY_S)
        metrics.REQUESTS_REJECTED.labels(tenant, "backlog_full").inc()
        return HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            f"tenant {tenant!r} has {charge.backlog_cap} or more events accepted but not yet committed (writers, Spark or the catalog "
            "are behind or down); retry later",
            headers={"Retry-After": str(BACKLOG_RETRY_S)},
        )
    over = limits.refusal(charge, verdict, detail)
    if over.retry_after_s == 0:
        metrics.REQUESTS_REJECTED.labels(tenant, "larger_than_burst").inc()
        return HTTPException(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, over.message)
    limits.note_refused(tenant, over.retry_after_s)
    metrics.REQUESTS_REJECTED.labels(tenant, "rate_limited").inc()
    return HTTPException(status.HTTP_429_TOO_MANY_REQUESTS, over.message, headers={"Retry-After": str(over.retry_after_s)})


def idempotency_digest(header: str | None) -> str | None:
    """The Redis-safe form of an Idempotency-Key header (any printable text up to 255 characters)."""
    if header is None:
        return None
    if not 0 < len(header) <= MAX_IDEMPOTENCY_KEY or not header.isprintable():
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST, f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} printable characters"
        )
    return hashlib.sha256(header.encode()).hexdigest()
