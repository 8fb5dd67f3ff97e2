"""POST /v1/tables/{name}/files: register Parquet files written elsewhere (a list of files, or an
object store's event notifications), each committed at most once; GET: the recent registrations.

Each file is checked here (service/iceberg/registration.py: where it is, what it is, whether the
table can read it) and, if accepted, handed to the table's leader through the commit stream, so it
is committed as Calve's own appends are: batched per commit interval, exactly once by the
watermark, acknowledged through a receipt (`wait=true`). A file is deduplicated by its path (and
by the caller's key, when one is given) for `registration_dedup_ttl_s`: taking the keys, creating
the receipt and appending the commit entry are one Redis script, so a notification delivered twice,
in any order, on any api replica, registers the file once. After the keys expire, the leader still
skips a file the table lists.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from dataclasses import dataclass, fields
from typing import Annotated, Literal
from urllib.parse import unquote_plus

import orjson
from cachetools import TTLCache
from fastapi import APIRouter, Body, Depends, HTTPException, Query, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from pyiceberg.table import Table

from service.api.deps import CatalogDep, ReadPrincipal, RedisDep, SettingsDep, TableName, WaiterDep, require_scope, table_or_404
from service.api.errors import AUTH_ERRORS, error_responses
from service.api.footers import FooterReaders
from service.core import keys, metrics
from service.core.config import Settings
from service.iceberg.registration import FileRefused, allowed_location, table_columns
from service.protocol import receipts, scripts
from service.protocol.commit_entry import CommitEntry
from service.protocol.receipts import COMMITTED, FAILED
from service.tenancy.tenants import Principal

router = APIRouter(prefix="/v1/tables", tags=["files"], responses=error_responses(*AUTH_ERRORS))
FilesPrincipal = Annotated[Principal, Depends(require_scope("files", "admin"))]
KEPT_REGISTRATIONS = 200  # the table's recent registrations, for GET and the console
TABLE_CACHE_S = 1.0  # a table loaded for checks serves this long: notifications come one file per call
# Both used on the event loop only (cachetools caches are not thread-safe).
_tables: TTLCache = TTLCache(maxsize=1000, ttl=TABLE_CACHE_S)  # (tenant, name) -> Table
_listed: TTLCache = TTLCache(maxsize=1000, ttl=TABLE_CACHE_S)  # members said to be in the leaders' registry


async def _table(catalog, tenant: str, name: str) -> Table:  # noqa: ANN001 - a pyiceberg Catalog
    """The table to check files against, loaded (on a worker thread) at most once per
    TABLE_CACHE_S: the leader checks every file again against the table as it is when it commits."""
    table = _tables.get((tenant, name))
    if table is None:
        table = _tables[(tenant, name)] = await run_in_threadpool(table_or_404, catalog, tenant, name)
    return table


async def _list(client, tenant: str, table: str) -> None:  # noqa: ANN001 - an async Redis
    """The table in the leaders' registry (a set outside the tenant's slot, never emptied): said
    at most once per TABLE_CACHE_S per table, not once per call (a notification is one file)."""
    member = keys.member(tenant, table)
    if member not in _listed:
        await client.sadd(keys.TABLES, member)
        _listed[member] = True


class FileToRegister(BaseModel):
    path: str = Field(min_length=1, max_length=2048, examples=["s3://landing/acme/events/part-0001.parquet"])
    size: int | None = Field(None, ge=0, description="the file's size in bytes, when known: a file of another size is refused")
    dedup_key: str | None = Field(None, min_length=1, max_length=1024, description="the file is registered once per key (and once per path)")


class S3Bucket(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str = Field(min_length=1, max_length=255)


class S3Object(BaseModel):
    model_config = ConfigDict(extra="ignore")
    key: str = Field(min_length=1, max_length=4096)
    size: int | None = Field(None, ge=0)
    eTag: str | None = None
    sequencer: str | None = None


class S3Entity(BaseModel):
    model_config = ConfigDict(extra="ignore")
    bucket: S3Bucket
    object: S3Object


class S3Record(BaseModel):
    """One record of an S3 event notification (as S3, MinIO or SeaweedFS deliver them to a webhook)."""

    model_config = ConfigDict(extra="ignore")
    eventName: str = ""
    s3: S3Entity | None = None


class Registration(BaseModel):
    """Either `files` (a list of files) or `Records` (an S3 event notification body)."""

    model_config = ConfigDict(extra="ignore")
    files: list[FileToRegister] | None = None
    Records: list[S3Record] | None = None


@dataclass
class Outcome:
    path: str
    status: Literal["accepted", "duplicate", "refused", "ignored"] = "accepted"
    rows: int | None = None
    bytes: int | None = None
    reason: str | None = None  # refused: a short code
    detail: str | None = None
    receipt: str | None = None  # duplicate: the registration that took the file first
    size: int | None = None
    dedup_key: str | None = None
    described: dict | None = None  # accepted: the DataFile the leader commits (registration.describe)

    def public(self) -> dict:
        return {k: v for k in _PUBLIC if (v := getattr(self, k)) is not None}


_PUBLIC = tuple(f.name for f in fields(Outcome) if f.name not in ("size", "dedup_key", "described"))


def _outcomes(body: Registration) -> list[Outcome]:
    """The files a body names (S3 records that create no object are answered as ignored)."""
    if body.files is not None:
        return [Outcome(f.path, size=f.size, dedup_key=f.dedup_key) for f in body.files]
    outcomes = []
    for record in body.Records or []:
        if record.s3 is None:
            outcomes.append(Outcome("", "ignored", detail="no s3 object in the record"))
            continue
        # Notifications spell keys URL-encoded, spaces as '+'.
        path = f"s3://{record.s3.bucket.name}/{unquote_plus(record.s3.object.key)}"
        if "ObjectCreated" not in record.eventName:
            outcomes.append(Outcome(path, "ignored", detail=f"{record.eventName or 'an event without a name'} registers nothing"))
            continue
        outcomes.append(Outcome(path, size=record.s3.object.size))
    return outcomes


def _digest(kind: str, value: str) -> str:
    return hashlib.sha256(f"{kind}\0{value}".encode()).hexdigest()[:40]


def _dedup_keys(tenant: str, table: str, outcome: Outcome) -> list[str]:
    found = [keys.registered_file_key(tenant, table, _digest("path", outcome.path))]
    if outcome.dedup_key:
        found.append(keys.registered_file_key(tenant, table, _digest("key", outcome.dedup_key)))
    return found


async def _inspect(footers: FooterReaders, table: Table, pending: list[Outcome]) -> None:
    """Read the pending files' footers (in the footer processes: service/api/footers.py); refuse
    those the table cannot take, describe the others."""
    if not pending:
        return
    checked = await footers.check(table, [(outcome.path, outcome.size) for outcome in pending])
    for outcome, result in zip(pending, checked, strict=True):
        if result.reason is not None:
            outcome.status, outcome.reason, outcome.detail = "refused", result.reason, result.detail
        else:
            outcome.rows, outcome.bytes, outcome.described = result.rows, result.bytes, result.described


@router.post(
    "/{name}/files",
    responses={
        200: {"description": "every file answered: with wait=true, the accepted ones are committed (or none was accepted)"},
        202: {"description": "the accepted files are durable in Redis and will be committed"},
        **error_responses(400, 404, 413, 422),
        500: {"description": "with wait=true: the commit of the accepted files can never succeed (detail says why)"},
    },
)
async def register_files(
    request: Request, name: TableName, principal: FilesPrincipal, catalog: CatalogDep, client: RedisDep,
    waiter: WaiterDep, settings: SettingsDep,
    wait: bool = Query(False, description="answer only after the accepted files are committed"),
    timeout: float | None = Query(None, gt=0, le=86400, description="seconds to wait with wait=true (default 30)"),
    body: Registration | None = Body(None),
) -> JSONResponse:
    tenant = principal.tenant
    if name.startswith(keys.RESERVED_TABLE_PREFIX):
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_ENTITY, f"{name} is Calve's own table: files cannot be registered into it")
    table = await _table(catalog, tenant, name)  # a table that is not there: 404 before the body
    if body is None or (body.files is None) == (body.Records is None):
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_ENTITY,
            'send either {"files": [{"path": ...}, ...]} or an S3 event notification ({"Records": [...]}), one of the two',
        )
    outcomes = _outcomes(body)
    if len(outcomes) > settings.registration_max_files:
        raise HTTPException(
            status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
            f"{len(outcomes)} files in one call; at most {settings.registration_max_files}: send the rest in further calls",
        )
    landing = [*settings.landing_prefixes.get(tenant, []), *principal.landing_prefixes]
    seen: dict[str, Outcome] = {}
    for outcome in outcomes:
        if outcome.status != "accepted":
            continue
        try:
            outcome.path = allowed_location(outcome.path, table.location(), landing, settings.resolved_warehouse())
        except FileRefused as exc:
            outcome.status, outcome.reason, outcome.detail = "refused", exc.reason, str(exc)
            continue
        if outcome.path in seen:
            outcome.status, outcome.detail = "duplicate", "named twice in this call"
        seen[outcome.path] = outcome
    pending = [o for o in outcomes if o.status == "accepted"]
    await _mark_registered(client, tenant, name, pending)  # cheap: no footer read for a file known already
    await _inspect(request.app.state.footers, table, [o for o in pending if o.status == "accepted"])
    receipt_id = await _register(client, settings, tenant, name, [o for o in pending if o.status == "accepted"])
    for outcome in outcomes:
        if outcome.status in ("accepted", "duplicate", "refused"):
            metrics.FILES_REGISTERED.labels(tenant, name, outcome.status, outcome.reason or "").inc()
    return await _answer(waiter, settings, tenant, table, receipt_id, outcomes, wait, timeout)


async def _mark_registered(client, tenant: str, table: str, outcomes: list[Outcome]) -> None:  # noqa: ANN001 - an async Redis
    if not outcomes:
        return
    names = [_dedup_keys(tenant, table, outcome) for outcome in outcomes]
    values = await client.mget([key for found in names for key in found])
    index = 0
    for outcome, found in zip(outcomes, names, strict=True):
        first = next((value for value in values[index:index + len(found)] if value is not None), None)
        index += len(found)
        if first is not None:
            outcome.status, outcome.receipt, outcome.detail = "duplicate", first.decode(), "registered before"


async def _register(client, settings: Settings, tenant: str, table: str, accepted: list[Outcome]) -> str | None:  # noqa: ANN001
    """Hand the accepted files to the table's leader in one commit entry, with their receipt; the
    files another call registered meanwhile become duplicates. None when nothing is left."""
    register = client.register_script(scripts.REGISTER)
    receipt_id = uuid.uuid4().hex
    while accepted:
        names = [_dedup_keys(tenant, table, outcome) for outcome in accepted]
        rows = sum(outcome.rows or 0 for outcome in accepted)
        now = f"{time.time():.3f}"
        # No events: registered rows need no writer, and stay out of the tenant's backlog.
        receipt_fields = [receipts.EVENTS, "0", receipts.PIPELINE, "files", receipts.CREATED_AT, now, *receipts.written_fields({table: rows}, now)]
        entry = CommitEntry(tenant, table, [o.path for o in accepted], {receipt_id: rows}, registered=True, described=[o.described for o in accepted])
        recent = [
            orjson.dumps({"path": o.path, "rows": o.rows, "bytes": o.bytes, "receipt": receipt_id, "at": float(now), "dedup_key": o.dedup_key}).decode()
            for o in accepted
        ]
        taken = await register(
            keys=[
                keys.receipt_key(tenant, receipt_id), keys.commit_stream_key(tenant, table), keys.registrations_key(tenant, table),
                *(key for found in names for key in found),
            ],
            args=[
                receipt_id, settings.registration_dedup_ttl_s, orjson.dumps(receipt_fields).decode(), settings.receipt_ttl_s,
                orjson.dumps(entry.to_fields("api")).decode(), orjson.dumps(recent).decode(), KEPT_REGISTRATIONS,
            ],
        )
        if not taken:
            await _list(client, tenant, table)
            return receipt_id
        # Another call registered some of these meanwhile: those are duplicates, the rest tries again.
        owners = [i for i, found in enumerate(names) for _ in found]
        for position in {owners[int(p) - 1] for p in taken}:
            accepted[position].status, accepted[position].detail = "duplicate", "registered meanwhile"
        accepted = [outcome for outcome in accepted if outcome.status == "accepted"]
    return None


async def _answer(
    waiter, settings: Settings, tenant: str, table: Table, receipt_id: str | None, outcomes: list[Outcome],  # noqa: ANN001
    wait: bool, timeout: float | None,
) -> JSONResponse:
    counts = {kind: sum(1 for o in outcomes if o.status == kind) for kind in ("accepted", "duplicate", "refused", "ignored")}
    answer: dict = {"receipt": receipt_id, "status": "buffered" if receipt_id else None, **counts, "files": [o.public() for o in outcomes]}
    if any(o.reason in ("columns", "types") for o in outcomes):
        answer["table_columns"] = table_columns(table.metadata)
    if receipt_id is None:
        # Nothing to commit: every file refused is an error of the request; else it is answered.
        code = status.HTTP_422_UNPROCESSABLE_ENTITY if counts["refused"] and counts["refused"] == len(outcomes) else status.HTTP_200_OK
        return JSONResponse(answer, status_code=code)
    answer["rows"] = sum(o.rows or 0 for o in outcomes if o.status == "accepted")
    if not wait:
        return JSONResponse(answer, status_code=status.HTTP_202_ACCEPTED)
    receipt = await waiter.wait(tenant, receipt_id, min(timeout or settings.wait_timeout_s, settings.max_wait_timeout_s))
    if receipt is None or receipt.status not in (COMMITTED, FAILED):
        return JSONResponse(answer, status_code=status.HTTP_202_ACCEPTED)
    answer.update(status=receipt.status, tables=receipt.tables)
    if receipt.status == FAILED:
        answer["detail"] = receipt.error
        return JSONResponse(answer, status_code=status.HTTP_500_INTERNAL_SERVER_ERROR)
    return JSONResponse(answer, status_code=status.HTTP_200_OK)


@router.get("/{name}/files", responses=error_responses(404, 422))
async def recent_registrations(
    name: TableName, principal: ReadPrincipal, client: RedisDep, catalog: CatalogDep, limit: int = Query(50, ge=1, le=KEPT_REGISTRATIONS),
) -> dict:
    """The table's most recent file registrations, newest first (the last KEPT_REGISTRATIONS are kept)."""
    await _table(catalog, principal.tenant, name)  # 404 for a table that is not there
    raw = await client.lrange(keys.registrations_key(principal.tenant, name), 0, limit - 1)
    return {"registrations": [orjson.loads(item) for item in raw]}
