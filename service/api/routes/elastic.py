"""Elasticsearch's bulk API, for the shippers and clients that speak it (the `elasticsearch`
client's helpers.bulk; Vector, Fluent Bit, Logstash and Filebeat outputs).

`POST|PUT /_bulk` and `/{index}/_bulk` take the bulk NDJSON: an action line, then (for index and
create) the document. An item's index names a pipeline of the tenant; its documents become that
pipeline's events, buffered as one request per pipeline exactly as a POST to its path would be.
- `index`, `create`: the document is an event. On a pipeline that changes rows by key (a sink
  with one identifier column and an `operation` that is a field name), the item's `_id` fills the
  identifier when the document lacks it, and the operation field says `insert`.
- `delete`: on such a pipeline, an event of the identifier (from `_id`) and operation `delete`;
  on any other pipeline it is refused for that item (400): there is no key to delete by.
- `update`: refused for that item (400): a partial document cannot be Calve's whole-row update.
The answer is the bulk format (`took`, `errors`, `items` with a status each: 201 created, 200
deleted, 4xx with an error); refused items leave the others accepted. Every answer here carries
`X-Elastic-Product: Elasticsearch`, which current clients check before they trust an answer.
"""

from __future__ import annotations

import functools
import os
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Annotated

import orjson
import redis.asyncio as aioredis
from fastapi import APIRouter, HTTPException, Path, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from sqlmodel import Session

from service.api.bodies import parsed_off_loop, read_body
from service.api.buffer import RequestBuffer
from service.api.deps import (
    BufferDep,
    IngestPrincipal,
    LimitsDep,
    SettingsDep,
    TableName,
    looked_up_again,
)
from service.api.errors import AUTH_ERRORS, error_responses
from service.api.events import (
    ParsedBody,
    decode_body,
    dumps_exact,
    event_lines,
    exact_event,
    loads_exact,
    may_hold_long_numbers,
    parse_events,
    parsed_body,
    too_many_events,
)
from service.api.routes.ingest import ROUTED, check_limits, in_flight, looked_at, refuse_while_draining
from service.core import metrics
from service.core.config import Settings
from service.core.exceptions import BadRequestBody, NotFound
from service.pipelines.store import MISSING, PipelineCache, PipelineRecord, get_pipeline
from service.tenancy.limits import TenantLimits
from service.tenancy.tenants import Principal

router = APIRouter(tags=["elasticsearch"], responses=error_responses(*AUTH_ERRORS))
PRODUCT = {"X-Elastic-Product": "Elasticsearch"}
VERSION = "8.17.0"  # what shippers read from GET / to pick the bulk dialect (no mapping types)
FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
ACTIONS = ("index", "create", "delete", "update")
# What clients put in action lines: _index and _id are read; the rest (routing, versions, ingest
# pipelines, the old mapping type) mean nothing to Calve and are ignored, as Elasticsearch would
# refuse any other key.
METADATA = {"_index", "_id", "_type", "routing", "pipeline", "require_alias", "require_data_stream", "version",
            "version_type", "if_seq_no", "if_primary_term", "retry_on_conflict", "dynamic_templates", "list_executed_pipelines"}
BULK_BODY = {
    "requestBody": {
        "required": True,
        "description": "Elasticsearch bulk NDJSON: an action line ({\"index\": {\"_index\": \"logs\"}}), then the document",
        "content": {
            "application/x-ndjson": {"schema": {"type": "string"}},
            # A body of one line is JSON too; the one action that needs no document line after it:
            "application/json": {"schema": {
                "type": "object", "required": ["delete"], "additionalProperties": False,
                "properties": {"delete": {"type": "object", "additionalProperties": False, "properties": {
                    "_index": {"type": "string"}, "_id": {"type": ["string", "integer"]}, **{key: {} for key in sorted(METADATA - {"_index", "_id"})},
                }}},
            }},
        },
    }
}
BULK_ERRORS = error_responses(400, 404, 413, 422, 429, 503)
DocumentId = Annotated[str, Path(min_length=1, max_length=512, description="the document's _id")]


def cluster_info() -> JSONResponse:
    """What `GET /` answers a JSON client: enough of Elasticsearch's for shippers' version probes."""
    return JSONResponse({
        "name": "calve", "cluster_name": "calve", "cluster_uuid": "calve",
        "version": {"number": VERSION, "build_flavor": "default", "lucene_version": "9.12.0",
                    "minimum_wire_compatibility_version": "7.17.0", "minimum_index_compatibility_version": "7.0.0"},
        "tagline": "You Know, for Search",
    }, headers=PRODUCT)


@dataclass
class _Target:
    """One pipeline's share of a bulk request."""

    record: PipelineRecord
    operation: str | None  # the field a row-changing sink reads its operation from
    identifier: str | None
    lines: list[bytes] = field(default_factory=list)  # the writer's lines (event_lines), as parse_events makes them
    items: list[int] = field(default_factory=list)  # positions in the answer
    parsed: ParsedBody | None = None  # the lines as one body, where they were parsed as one (_plan_alike)

    def events(self) -> ParsedBody | None:
        return self.parsed or (parsed_body(self.lines) if self.lines else None)


def _row_changes(record: PipelineRecord) -> tuple[str | None, str | None]:
    for sink in record.definition.sinks:
        keys = sink.identifier_columns or []
        if sink.operation and FIELD.fullmatch(sink.operation) and len(keys) == 1:
            return sink.operation, keys[0]
    return None, None


SHARDS = {"total": 1, "successful": 1, "failed": 0}  # every accepted item's, shared (the answer is only encoded)


def _item(action: str, index: str, doc_id: str, status_code: int, error: str | None = None, kind: str = "illegal_argument_exception") -> dict:
    body: dict = {"_index": index, "_id": doc_id, "status": status_code}
    if error is None:
        body |= {"_version": 1, "result": "deleted" if action == "delete" else "created", "_shards": SHARDS}
    else:
        body["error"] = {"type": kind, "reason": error}
    return {action: body}


@dataclass(frozen=True)
class _Created:
    """The answer's items when every item was created alike (_plan_alike): the `_item`s, or their
    JSON written straight from one template (an answer holds one per document: building and
    encoding a dict each cost more than parsing the document)."""

    action: str
    index: str
    ids: str  # each item's _id: this, then its place in 8 hex digits
    count: int

    def items(self) -> list[dict]:
        return [_item(self.action, self.index, f"{self.ids}{number:08x}", 201) for number in range(self.count)]

    def encoded(self) -> orjson.Fragment:
        head = orjson.dumps({self.action: {"_index": self.index}})[:-2] + b',"_id":"' + self.ids.encode()
        tail = b'","status":201,"_version":1,"result":"created","_shards":' + orjson.dumps(SHARDS) + b"}}"
        return orjson.Fragment(b"[" + b",".join([b"%s%08x%s" % (head, number, tail) for number in range(self.count)]) + b"]")


Items = list[dict] | _Created


def _action(text: bytes, number: int, seen: dict[bytes, tuple[str, dict]]) -> tuple[str, dict]:
    """An action line's (action, metadata), checked (BadRequestBody naming line `number`), kept in `seen`."""
    try:
        action_line = loads_exact(text, orjson.loads(text))  # an _id beyond 64 bits too
    except orjson.JSONDecodeError as exc:
        raise BadRequestBody(f"bulk line {number} is not JSON: {exc}") from None
    if not isinstance(action_line, dict) or len(action_line) != 1 or next(iter(action_line)) not in ACTIONS:
        raise BadRequestBody(f"bulk line {number}: an action is one of {list(ACTIONS)} with its metadata, e.g. {{\"index\": {{}}}}")
    action, meta = next(iter(action_line.items()))
    if not isinstance(meta, dict):
        raise BadRequestBody(f"bulk line {number}: the {action} action's metadata is an object, e.g. {{\"_index\": \"logs\"}}")
    if unknown := sorted(set(meta) - METADATA):
        raise BadRequestBody(f"bulk line {number}: unknown action metadata {unknown[:5]}; Calve reads _index and _id")
    if not isinstance(meta.get("_index", ""), str) or not isinstance(meta.get("_id", ""), (str, int)) or isinstance(meta.get("_id"), bool):
        raise BadRequestBody(f"bulk line {number}: _index is a string, _id a string or an integer")
    seen[text] = action, meta
    return action, meta


class _Uncached(Exception):
    """A bulk body names a pipeline the api does not keep: it is planned again where the DB can be read."""


def _plan(body: bytes, default_index: str | None, load) -> tuple[Items, dict[str, _Target]]:  # noqa: ANN001 - name -> PipelineRecord
    """The answer's items (refused ones filled in) and the events per pipeline."""
    lines = [line for line in body.split(b"\n") if line.strip()]
    if not lines:
        raise BadRequestBody("the bulk body is empty: send an action line, then the document, per item")
    ids = os.urandom(12).hex()  # documents without an _id: this, then the item's place (unique across requests)
    return _plan_alike(lines, default_index, load, ids) or _plan_each(lines, default_index, load, ids, may_hold_long_numbers(body))


def _plan_alike(lines: list[bytes], default_index: str | None, load, ids: str) -> tuple[_Created, dict[str, _Target]] | None:  # noqa: ANN001
    """What _plan_each makes of the body shippers send: one action line, index or create without an
    _id, before every document, into a pipeline that appends. Its documents are read as an NDJSON
    body's events are, all at once. None for any other body, or one with a document that is not
    an object or that is set aside (then each item is planned on its own)."""
    actions, documents = lines[0::2], lines[1::2]
    if len(actions) != len(documents) or actions.count(actions[0]) != len(actions):
        return None
    action, meta = _action(actions[0], 1, {})
    index = str(meta.get("_index") or default_index or "")
    if action not in ("index", "create") or meta.get("_id") is not None or not index:
        return None
    try:
        target = _Target(load(index), None, None)
    except NotFound:
        return None
    if _row_changes(target.record)[0] is not None:
        return None
    try:
        parsed = parse_events(b"\n".join(documents), "application/x-ndjson", 2 * len(documents))
    except BadRequestBody:
        return None
    if parsed.set_aside:
        return None  # a document too deep to parse is an item's error there, a DLQ entry here
    target.parsed = parsed
    target.items = list(range(len(documents)))
    return _Created(action, index, ids, len(documents)), {index: target}


def _plan_each(lines: list[bytes], default_index: str | None, load, ids: str, long_numbers: bool) -> tuple[list[dict], dict[str, _Target]]:  # noqa: ANN001
    """Each item on its own: its action, its document, its answer. long_numbers: the body may hold
    an integer orjson cannot keep (then each document is read again exactly)."""
    items: list[dict] = []
    targets: dict[str, _Target] = {}
    actions: dict[bytes, tuple[str, dict]] = {}  # a shipper repeats the same action line: each text is read once
    position = 0
    while position < len(lines):
        action, meta = actions.get(lines[position]) or _action(lines[position], position + 1, actions)
        position += 1
        document = None
        if action != "delete":
            if position >= len(lines):
                raise BadRequestBody(f"bulk line {position}: the {action} action has no document line after it")
            try:
                document = orjson.loads(lines[position])
                if long_numbers and may_hold_long_numbers(lines[position]):
                    document = exact_event(lines[position])
            except orjson.JSONDecodeError:
                document = None
            position += 1
        index = str(meta.get("_index") or default_index or "")
        doc_id = str(meta["_id"]) if meta.get("_id") is not None else f"{ids}{len(items):08x}"
        if not index:
            items.append(_item(action, index, doc_id, 400, "no index: name one in the action or the path (/{index}/_bulk)"))
            continue
        if index not in targets:
            try:
                record = load(index)
            except NotFound:
                items.append(_item(action, index, doc_id, 404, f"no pipeline {index!r}: an index is a pipeline of the tenant", "index_not_found_exception"))
                continue
            targets[index] = _Target(record, *_row_changes(record))
        target = targets[index]
        if action == "update":
            items.append(_item(action, index, doc_id, 400, "update is not supported: send the whole document with index"))
            continue
        if action == "delete":
            if target.operation is None:
                items.append(_item(action, index, doc_id, 400, f"pipeline {index!r} does not change rows by key "
                                   "(a sink with one identifier column and an operation field): nothing to delete by"))
                continue
            event = {target.identifier: doc_id, target.operation: "delete"}
        else:
            if not isinstance(document, dict):
                items.append(_item(action, index, doc_id, 400, "the document is not a JSON object", "mapper_parsing_exception"))
                continue
            event = document
            if target.operation is None:
                # As on /logs: an event too deeply nested to encode again is set aside for the
                # DLQ, with its original text.
                target.lines.extend(event_lines(document, lines[position - 1]))
                target.items.append(len(items))
                items.append(_item(action, index, doc_id, 201))
                continue
            event.setdefault(target.identifier, doc_id)
            event[target.operation] = "insert"
        if dumps_exact(event) is None:
            items.append(_item(action, index, doc_id, 400, "the document nests too deeply to change a row by; flatten it",
                               "mapper_parsing_exception"))
            continue
        target.lines.extend(event_lines(event))
        target.items.append(len(items))
        items.append(_item(action, index, doc_id, 200 if action == "delete" else 201))
    return items, targets


async def bulk(request: Request, principal: Principal, settings: Settings, buffer: RequestBuffer, limits: TenantLimits,
               index: str | None) -> Response:
    """Every item is checked and every target's events parsed before anything is buffered, and the
    tenant's limits are charged once for the whole request: a refusal (400, 413, 429, 503) leaves
    nothing of the request accepted, so the shipper's retry of the whole body duplicates nothing."""
    started = time.monotonic()
    refuse_while_draining(request, PRODUCT)
    raw = await read_body(request, settings.max_body_bytes)
    body = decode_body(raw, request.headers.get("content-encoding", ""), settings.max_decompressed_bytes)
    # Before planning, while the tenant was refused lately: the backlog cap, and one event at least
    # (of the documents' bytes, charged as parsed, nothing is known yet). A body that would buffer
    # nothing (every item refused) is refused with the rest then.
    async with looked_at(limits, principal, settings, None, 1, 0):
        items = await _accept_items(request, principal, settings, buffer, limits, body, index)
    if isinstance(items, _Created):
        errors, encoded = False, items.encoded()
    else:
        errors, encoded = any("error" in next(iter(item.values())) for item in items), items
    answer = {"took": int((time.monotonic() - started) * 1000), "errors": errors, "items": encoded}
    return Response(orjson.dumps(answer), media_type="application/json", headers=PRODUCT)


async def _accept_items(request: Request, principal: Principal, settings: Settings, buffer: RequestBuffer, limits: TenantLimits,
                        body: bytes, index: str | None) -> Items:
    """The bulk body's items, planned, parsed and buffered: the answer's items."""
    tenant = principal.tenant
    engine = request.app.state.engine
    cache: PipelineCache = request.app.state.pipelines

    def stored(name: str) -> PipelineRecord | None:
        with Session(engine) as session:
            try:
                return get_pipeline(session, tenant, name)
            except NotFound:
                return None

    def load(name: str) -> PipelineRecord:
        # Kept as a path's pipeline is (a change announced by any api clears it), by name.
        if (record := cache.get((tenant, f"name:{name}"), functools.partial(stored, name))) is None:
            raise NotFound(f"no pipeline {name!r}")
        return record

    def cached(name: str) -> PipelineRecord:
        if (record := cache.cached((tenant, f"name:{name}"))) is MISSING:
            raise _Uncached
        if record is None:
            raise NotFound(f"no pipeline {name!r}")
        return record

    # Planned where a plain body is parsed (bodies.parsed_off_loop: on the loop, or in the parsing
    # thread when large), with the pipelines the api keeps; a body naming one it does not keep is
    # planned again in the threadpool, where the DB is read. Every body in the threadpool, and
    # through FastAPI's routing, cost the api 3.43-3.84 ms of CPU a 1,000-document body against
    # 2.46-2.49 now, 0.93 against 0.50 ms a 10-document one (make bench-api; with fast_ingest.py).
    try:
        items, targets = await parsed_off_loop(tenant, len(body), _plan, body, index, cached)
    except _Uncached:
        items, targets = await run_in_threadpool(_plan, body, index, load)
    for name in targets:  # looked up again before they expire (RefreshAhead), as a path's pipeline is
        if cache.due((tenant, f"name:{name}")):
            looked_up_again(cache.refresh, (tenant, f"name:{name}"), functools.partial(stored, name))
    batches: list[tuple[str, ParsedBody]] = []
    for name, target in targets.items():
        if (events := target.events()) is None:
            continue
        if not principal.may_ingest_into(name):
            if isinstance(items, _Created):
                items = items.items()
            for position in target.items:
                action = next(iter(items[position]))
                items[position] = _item(action, name, items[position][action]["_id"], 403,
                                        f"this token may not ingest into pipeline {name!r}", "security_exception")
            continue
        if events.events > settings.max_events_per_request:
            raise too_many_events(settings.max_events_per_request)
        batches.append((name, events))
    try:
        with in_flight(request):
            if batches:
                await check_limits(limits, principal, settings, sum(p.events for _n, p in batches), sum(len(p.ndjson) for _n, p in batches))
            for name, parsed in batches:
                await buffer.add(tenant, name, uuid.uuid4().hex, parsed, None)
                metrics.EVENTS_RECEIVED.labels(tenant, name).inc(parsed.events)
                metrics.BYTES_RECEIVED.labels(tenant, name).inc(len(parsed.ndjson))
    except aioredis.RedisError as exc:
        metrics.REQUESTS_REJECTED.labels(tenant, "redis_unavailable").inc()
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, "the buffer (Redis) is unavailable; retry later",
                            headers={"Retry-After": "5", **PRODUCT}) from exc
    return items


@router.post("/_bulk", openapi_extra=BULK_BODY, responses=BULK_ERRORS)
async def bulk_any(request: Request, principal: IngestPrincipal, settings: SettingsDep, buffer: BufferDep, limits: LimitsDep) -> Response:
    ROUTED.inc()  # (the known ones: service/api/fast_ingest.py SHIPPERS)
    return await bulk(request, principal, settings, buffer, limits, None)


@router.put("/_bulk", openapi_extra=BULK_BODY, responses=BULK_ERRORS)
async def bulk_any_put(request: Request, principal: IngestPrincipal, settings: SettingsDep, buffer: BufferDep, limits: LimitsDep) -> Response:
    return await bulk(request, principal, settings, buffer, limits, None)


@router.post("/{index}/_bulk", openapi_extra=BULK_BODY, responses=BULK_ERRORS)
async def bulk_index(
    index: TableName, request: Request, principal: IngestPrincipal, settings: SettingsDep, buffer: BufferDep, limits: LimitsDep,
) -> Response:
    ROUTED.inc()
    return await bulk(request, principal, settings, buffer, limits, index)


@router.put("/{index}/_bulk", openapi_extra=BULK_BODY, responses=BULK_ERRORS)
async def bulk_index_put(
    index: TableName, request: Request, principal: IngestPrincipal, settings: SettingsDep, buffer: BufferDep, limits: LimitsDep,
) -> Response:
    return await bulk(request, principal, settings, buffer, limits, index)


# -- one document at a time: what applications' clients send (`client.index(...)`) ----------------

DOCUMENT_BODY = {
    "requestBody": {
        "required": True,
        "description": "one document: a JSON object, an event of the pipeline the index names",
        "content": {"application/json": {"schema": {"type": "object"}}},
    }
}
DOCUMENT_ANSWERS = {201: {"description": "the document is accepted (buffered): Elasticsearch's index answer"},
                    **error_responses(400, 403, 404, 413, 422, 429, 503)}


async def _one_document(request: Request, principal: Principal, settings: Settings, buffer: RequestBuffer, limits: TenantLimits,
                        index: str, action: str, doc_id: str | None) -> JSONResponse:
    """The document as a bulk item of `action` (same rules, same buffering), answered as
    Elasticsearch answers its single-document APIs: the item's fields, or its error, with its status."""
    refuse_while_draining(request, PRODUCT)
    raw = await read_body(request, settings.max_body_bytes)
    # One line, as a bulk body holds it: a newline in JSON text is whitespace between tokens
    # (inside a string it would be an escape), so a pretty-printed document reads the same.
    document = decode_body(raw, request.headers.get("content-encoding", ""), settings.max_decompressed_bytes).strip().replace(b"\n", b" ")
    meta = {"_index": index} | ({"_id": doc_id} if doc_id is not None else {})
    items = await _accept_items(request, principal, settings, buffer, limits, orjson.dumps({action: meta}) + b"\n" + document, None)
    [item] = items.items() if isinstance(items, _Created) else items
    answer = item[action]
    code = answer.pop("status")
    if "error" in answer:
        # Elasticsearch's error shape, and Calve's `detail`, so both kinds of client read it.
        body = {"error": answer["error"], "status": code, "detail": answer["error"]["reason"]}
        return JSONResponse(body, status_code=code, headers=PRODUCT)
    return JSONResponse(answer | {"_seq_no": 0, "_primary_term": 1}, status_code=code, headers=PRODUCT)


@router.post("/{index}/_doc", openapi_extra=DOCUMENT_BODY, responses=DOCUMENT_ANSWERS, status_code=201)
async def index_document(
    index: TableName, request: Request, principal: IngestPrincipal, settings: SettingsDep, buffer: BufferDep, limits: LimitsDep,
) -> Response:
    return await _one_document(request, principal, settings, buffer, limits, index, "index", None)


# One route per method: one route of two methods gave both the same OpenAPI operation id.
@router.put("/{index}/_doc/{doc_id}", openapi_extra=DOCUMENT_BODY, responses=DOCUMENT_ANSWERS, status_code=201)
@router.post("/{index}/_doc/{doc_id}", openapi_extra=DOCUMENT_BODY, responses=DOCUMENT_ANSWERS, status_code=201)
async def index_document_by_id(
    index: TableName, doc_id: DocumentId, request: Request, principal: IngestPrincipal, settings: SettingsDep, buffer: BufferDep,
    limits: LimitsDep,
) -> Response:
    return await _one_document(request, principal, settings, buffer, limits, index, "index", doc_id)


# One route per method: one route of two methods gave both the same OpenAPI operation id.
@router.put("/{index}/_create/{doc_id}", openapi_extra=DOCUMENT_BODY, responses=DOCUMENT_ANSWERS, status_code=201)
@router.post("/{index}/_create/{doc_id}", openapi_extra=DOCUMENT_BODY, responses=DOCUMENT_ANSWERS, status_code=201)
async def create_document(
    index: TableName, doc_id: DocumentId, request: Request, principal: IngestPrincipal, settings: SettingsDep, buffer: BufferDep,
    limits: LimitsDep,
) -> Response:
    return await _one_document(request, principal, settings, buffer, limits, index, "create", doc_id)
