"""/v1/dlq: the tenant's dead-letter table — list, replay through the current pipeline, purge.

The DLQ is an Iceberg table (`_calve_dlq`) in the tenant's namespace; every entry keeps the
original event, the reason, the pipeline (and its version), the table, the receipt and the time.
"""

from __future__ import annotations

import hashlib
import uuid

import pyarrow as pa
import pyarrow.compute as pc
from fastapi import APIRouter, HTTPException, Query, status
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.expressions import AlwaysTrue, And, BooleanExpression, EqualTo, In
from tenacity import RetryError, retry, retry_if_exception_type, stop_after_attempt

from service.api.deps import (
    AdminPrincipal,
    BufferDep,
    CatalogDep,
    ReadPrincipal,
    RedisDep,
)
from service.api.errors import AUTH_ERRORS, error_responses
from service.api.events import normalize_events
from service.core import keys
from service.iceberg.catalog import load_table

router = APIRouter(prefix="/v1/dlq", tags=["dlq"], responses=error_responses(*AUTH_ERRORS))
MAX_PAGE = 1000
MAX_REPLAY = 10_000
REPLAY_LOCK_S = 3600  # an entry being replayed cannot be replayed again meanwhile
DELETE_ATTEMPTS = 5
CURSOR_PATTERN = r"^[0-9]{1,20}:[0-9a-f-]{1,64}$"


class DlqFilter(BaseModel):
    pipeline: str | None = None
    table: str | None = None
    reason: str | None = Field(None, description="entries whose reason contains this text")


class ReplayRequest(DlqFilter):
    ids: list[str] | None = Field(None, max_length=MAX_REPLAY, description="dlq_ids to replay; or use the filter fields")
    limit: int = Field(1000, ge=1, le=MAX_REPLAY)


def _row_filter(selected: DlqFilter, ids: list[str] | None = None) -> BooleanExpression:
    parts: list[BooleanExpression] = []
    if selected.pipeline:
        parts.append(EqualTo("pipeline", selected.pipeline))
    if selected.table:
        parts.append(EqualTo("table", selected.table))
    if ids:
        parts.append(In(keys.DLQ_ID, ids))
    expression: BooleanExpression = AlwaysTrue()
    for part in parts:
        expression = part if isinstance(expression, AlwaysTrue) else And(expression, part)
    return expression


def _entries(catalog: Catalog, tenant: str, selected: DlqFilter, ids: list[str] | None = None) -> pa.Table:
    """Matching entries, oldest first (ties by dlq_id), as Arrow."""
    table = load_table(catalog, tenant, keys.DLQ_TABLE)
    if table is None:
        return pa.table({keys.DLQ_ID: pa.array([], pa.string())})
    rows = table.scan(row_filter=_row_filter(selected, ids)).to_arrow()
    if selected.reason:
        rows = rows.filter(pc.match_substring(rows.column("reason"), selected.reason))
    return rows.sort_by([("failed_at", "ascending"), (keys.DLQ_ID, "ascending")])


def _cursor(row: dict) -> str:
    return f"{int(row['failed_at'].timestamp() * 1_000_000)}:{row[keys.DLQ_ID]}"


@router.get("", responses=error_responses(422))
def list_entries(
    principal: ReadPrincipal,
    catalog: CatalogDep,
    pipeline: str | None = None,
    table: str | None = None,
    reason: str | None = Query(None, description="entries whose reason contains this text"),
    limit: int = Query(100, ge=1, le=MAX_PAGE),
    cursor: str | None = Query(None, pattern=CURSOR_PATTERN, description="next_cursor of the previous page"),
) -> dict:
    rows = _entries(catalog, principal.tenant, DlqFilter(pipeline=pipeline, table=table, reason=reason)).to_pylist()
    if cursor:
        micros, _, last_id = cursor.partition(":")  # CURSOR_PATTERN made sure of its shape
        after = (int(micros), last_id)
        rows = [r for r in rows if (int(r["failed_at"].timestamp() * 1_000_000), r[keys.DLQ_ID]) > after]
    page = rows[:limit]
    return {
        "entries": page,
        "next_cursor": _cursor(page[-1]) if len(rows) > limit else None,
    }


@router.post("/replay", responses=error_responses(400, 413, 422))
async def replay(
    body: ReplayRequest, principal: AdminPrincipal, catalog: CatalogDep, client: RedisDep, buffer: BufferDep
) -> dict:
    """Run entries through their pipeline's current version again. Each replayed entry leaves the
    DLQ in the DLQ table commit of the batch that re-runs it; an entry already being replayed is
    skipped, so two replays never write one event twice."""
    if not body.ids and not (body.pipeline or body.table or body.reason):
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_ENTITY, "name the entries (ids) or a filter (pipeline, table, reason)")
    rows = (await run_in_threadpool(_entries, catalog, principal.tenant, body, body.ids)).to_pylist()[: body.limit]
    tenant = principal.tenant
    locked, skipped = [], []
    for row in rows:
        if await client.set(keys.dlq_replay_lock_key(tenant, row[keys.DLQ_ID]), b"1", nx=True, ex=REPLAY_LOCK_S):
            locked.append(row)
        else:
            skipped.append(row[keys.DLQ_ID])
    receipts: dict[str, str] = {}
    by_pipeline: dict[str, list[dict]] = {}
    for row in locked:
        by_pipeline.setdefault(row["pipeline"], []).append(row)
    for pipeline, entries in sorted(by_pipeline.items()):
        ids = [entry[keys.DLQ_ID] for entry in entries]
        # Checked as intake checks a request: an event still too deep is set aside again instead
        # of reaching Spark.
        parsed = await run_in_threadpool(normalize_events, [entry["event"].encode() for entry in entries])
        digest = hashlib.sha256(("dlq-replay:" + ",".join(sorted(ids))).encode()).hexdigest()
        receipt_id = uuid.uuid4().hex
        first = await buffer.add(tenant, pipeline, receipt_id, parsed, digest, replays=ids)
        receipts[pipeline] = first or receipt_id
    return {"replayed": len(locked), "skipped_already_replaying": skipped, "receipts": receipts}


def _purge(catalog: Catalog, tenant: str, selected: DlqFilter) -> int:
    ids = _entries(catalog, tenant, selected).column(keys.DLQ_ID).to_pylist()
    if not ids:
        return 0

    # The committer appended meanwhile: deleting by id is safe to repeat on the reloaded table.
    @retry(retry=retry_if_exception_type(CommitFailedException), stop=stop_after_attempt(DELETE_ATTEMPTS))
    def delete() -> None:
        load_table(catalog, tenant, keys.DLQ_TABLE).delete(In(keys.DLQ_ID, ids))

    try:
        delete()
    except RetryError:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, "the DLQ table kept changing; retry", headers={"Retry-After": "1"}) from None
    return len(ids)


@router.delete("", responses=error_responses(422, 503))
async def purge(
    principal: AdminPrincipal,
    catalog: CatalogDep,
    pipeline: str | None = None,
    table: str | None = None,
    reason: str | None = None,
    all: bool = Query(False, description="purge every entry (needed when no filter is given)"),  # noqa: A002
) -> dict:
    if not (pipeline or table or reason or all):
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_ENTITY, "give a filter (pipeline, table, reason) or all=true")
    deleted = await run_in_threadpool(_purge, catalog, principal.tenant, DlqFilter(pipeline=pipeline, table=table, reason=reason))
    return {"deleted": deleted}
