"""The change feed: GET /v1/tables/{name}/changes between two snapshots, and resumable consumers
(/v1/tables/{name}/consumers) that page through a table's changes and acknowledge a cursor."""

from __future__ import annotations

import asyncio
import base64
import functools
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from typing import Annotated, Any, Literal

import orjson
import pyarrow as pa
from fastapi import APIRouter, Path, Query, Request, status
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, Field
from pyiceberg.table import Table

from service.api.deps import (
    AdminPrincipal,
    CatalogDep,
    ConsumePrincipal,
    ConsumerReadPrincipal,
    ReadPrincipal,
    SessionDep,
    TableName,
    table_or_404,
)
from service.api.errors import AUTH_ERRORS, error_responses
from service.core.exceptions import ConsumerLagging, HistoryExpired, NotAnAncestor, SnapshotMissing
from service.core.models import ChangeConsumer
from service.feeds.consumers import EARLIEST, LATEST, ConsumerStore, held_snapshot
from service.feeds.cursors import LOAD, Cursor
from service.feeds.pages import read_page, stream
from service.feeds.spark_diffs import SparkDiffs
from service.tenancy.names import NAME_PATTERN, RULE

router = APIRouter(prefix="/v1/tables", tags=["changes"], responses=error_responses(*AUTH_ERRORS))
SnapshotId = Annotated[int | None, Query(ge=-(2**63), le=2**63 - 1, description="a snapshot id of the table")]
ConsumerName = Annotated[str, Path(pattern=NAME_PATTERN, description=RULE)]
MAX_PAGE = 10_000


def _json_value(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, Decimal):
        return str(value)  # exact, as the reference design keeps decimals
    return str(value)


def _ndjson(batch: pa.RecordBatch) -> bytes:
    return b"".join(orjson.dumps(row, default=_json_value, option=orjson.OPT_NON_STR_KEYS) + b"\n" for row in batch.to_pylist(maps_as_pydicts="lossy"))


# Feed reads run on these threads, not on the api's shared pool of ~40: Arrow's allocator keeps a
# cache per thread, so reads spread over every pool thread grow the process (reading a 1,000,000-
# row initial load page by page from 40 threads: +480 MiB; from one thread: +31 MiB).
FEED_READERS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="feed-reader")


async def on_feed_reader(fn: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(FEED_READERS, functools.partial(fn, *args))


def spark_differ(request: Request) -> SparkDiffs:
    settings = request.app.state.settings
    return SparkDiffs(request.app.state.sync_redis, settings.feed_spark_rows, settings.feed_diff_timeout_s)


async def _stream_ndjson(first: bytes | None, chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    if first:
        yield first
    while (chunk := await on_feed_reader(next, chunks, None)) is not None:
        yield chunk


@router.get(
    "/{name}/changes",
    responses={**error_responses(404, 409, 410, 422), 200: {"content": {"application/x-ndjson": {}}, "description": "one changed row per line"}},
    response_class=StreamingResponse,
)
async def table_changes(
    name: TableName, principal: ReadPrincipal, catalog: CatalogDep, request: Request,
    from_snapshot: SnapshotId = None, to_snapshot: SnapshotId = None,
) -> Response:
    """The changed rows after `from_snapshot` (exclusive; absent: from the table's first snapshot)
    up to `to_snapshot` (default: the current one), as NDJSON: the row's columns in the table's
    current schema, `_change_type` (INSERT, DELETE, UPDATE_BEFORE, UPDATE_AFTER), `_snapshot_id`,
    `_committed_at` and, for tables with identifier columns, `_document_id`. Snapshots in order;
    compactions emit nothing; rows a rewrite carried over unchanged are not emitted."""

    differ = spark_differ(request)

    def start() -> tuple[bytes | None, Iterator[bytes]]:
        table = table_or_404(catalog, principal.tenant, name)
        cursor = Cursor.after(from_snapshot) if from_snapshot is not None else Cursor.origin()
        chunks = (_ndjson(batch) for batch, _cursor_after in stream(table, cursor, to_snapshot, differ) if batch.num_rows)
        return next(chunks, None), chunks  # what cannot be read is refused here, before the status is sent

    first, chunks = await on_feed_reader(start)
    return StreamingResponse(_stream_ndjson(first, chunks), media_type="application/x-ndjson")


# -- consumers ----------------------------------------------------------------------------------

class ConsumerIn(BaseModel):
    name: str = Field(pattern=NAME_PATTERN, description=RULE)
    start: Literal["earliest", "latest"] | Annotated[int, Field(ge=-(2**63), le=2**63 - 1)] = Field(
        LATEST, description="earliest (the oldest snapshot kept), latest (the current one) or a snapshot id of the table's history",
    )
    initial_load: bool = Field(False, description="read the starting snapshot whole (as INSERTs) before its changes")


class AckIn(BaseModel):
    cursor: str = Field(max_length=200, description="a cursor a page of this consumer's changes returned")


def _view(consumer: ChangeConsumer, table: Table | None) -> dict:
    cursor = Cursor.parse(consumer.cursor)
    held = held_snapshot(table, cursor) if table is not None else None
    return {
        "name": consumer.name,
        "table": consumer.table_name,
        "start": consumer.start,
        "initial_load": consumer.initial_load,
        "cursor": consumer.cursor,
        "phase": "initial_load" if cursor.phase == LOAD else "changes",
        "created_at": consumer.created_at,
        "acked_at": consumer.acked_at,
        "lagging": consumer.lagging_since is not None,
        "lagging_since": consumer.lagging_since,
        "held_snapshot_id": held.snapshot_id if held else None,
        "held_for_s": round(time.time() - held.timestamp_ms / 1000, 1) if held else None,
    }


CONSUMER_ERRORS = error_responses(404, 409, 410, 422)
WITH_BODY_ERRORS = error_responses(400, 404, 409, 410, 422)  # a body that is not JSON: 400


@router.post("/{name}/consumers", status_code=status.HTTP_201_CREATED, responses=WITH_BODY_ERRORS)
def create_consumer(name: TableName, body: ConsumerIn, principal: AdminPrincipal, catalog: CatalogDep, session: SessionDep) -> dict:
    """A consumer of the table's changes, starting where `start` says."""
    table = table_or_404(catalog, principal.tenant, name)
    start = body.start if body.start in (EARLIEST, LATEST) else str(body.start)
    consumer = ConsumerStore(session, principal.tenant).create(table, name, body.name, start, body.initial_load)
    return _view(consumer, table)


@router.get("/{name}/consumers", responses=error_responses(404, 422))
def list_consumers(name: TableName, principal: ConsumerReadPrincipal, catalog: CatalogDep, session: SessionDep) -> dict:
    table = table_or_404(catalog, principal.tenant, name)
    return {"consumers": [_view(consumer, table) for consumer in ConsumerStore(session, principal.tenant).list(name)]}


@router.get("/{name}/consumers/{consumer}", responses=error_responses(404, 422))
def show_consumer(name: TableName, consumer: ConsumerName, principal: ConsumerReadPrincipal, catalog: CatalogDep, session: SessionDep) -> dict:
    table = table_or_404(catalog, principal.tenant, name)
    return _view(ConsumerStore(session, principal.tenant).get(name, consumer), table)


@router.delete("/{name}/consumers/{consumer}", status_code=status.HTTP_204_NO_CONTENT, responses=error_responses(404, 422))
def delete_consumer(name: TableName, consumer: ConsumerName, principal: AdminPrincipal, session: SessionDep) -> Response:
    """Forget the consumer: the snapshots it held are expired as the table's policy says."""
    ConsumerStore(session, principal.tenant).delete(name, consumer)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/{name}/consumers/{consumer}/changes", responses=CONSUMER_ERRORS)
async def consumer_changes(
    name: TableName, consumer: ConsumerName, principal: ConsumerReadPrincipal, catalog: CatalogDep, session: SessionDep, request: Request,
    limit: int = Query(1000, ge=1, le=MAX_PAGE),
) -> Response:
    """The next changes after the consumer's checkpoint (at most `limit` rows), and the `cursor`
    after them: POST it to .../ack once they are handled. Until then the same changes come again."""
    return await on_feed_reader(_consumer_page, catalog, session, principal.tenant, name, consumer, limit, spark_differ(request))


def _consumer_page(
    catalog: CatalogDep, session: SessionDep, tenant: str, name: str, consumer: str, limit: int, differ: SparkDiffs,
) -> Response:
    table = table_or_404(catalog, tenant, name)
    store = ConsumerStore(session, tenant)
    record = store.get(name, consumer)
    if record.lagging_since is not None:
        raise ConsumerLagging(_lagging(record, "it lagged before"))
    try:
        page = read_page(table, Cursor.parse(record.cursor), limit, differ)
    except (SnapshotMissing, HistoryExpired, NotAnAncestor) as exc:
        store.mark_lagging(record)
        raise ConsumerLagging(_lagging(record, str(exc))) from exc
    # Encoded batch by batch: the page's rows are never all Python objects at once.
    rows = b",".join(_json_array_items(batch) for batch in page.batches if batch.num_rows)
    tail = orjson.dumps({"cursor": page.cursor.text(), "more": page.more, "checkpoint": record.cursor})
    return Response(b'{"changes":[' + rows + b"]," + tail[1:], media_type="application/json")


def _json_array_items(batch: pa.RecordBatch) -> bytes:
    return orjson.dumps(batch.to_pylist(maps_as_pydicts="lossy"), default=_json_value, option=orjson.OPT_NON_STR_KEYS)[1:-1]


def _lagging(record: ChangeConsumer, why: str) -> str:
    return (
        f"consumer {record.name!r} lags: {why}; the snapshots it had read to are gone (it held them longer than "
        "CALVE_CONSUMER_MAX_LAG_S allows, or the table's history was rewritten): DELETE it and create it again, "
        "with initial_load: true to read the table whole"
    )


@router.post("/{name}/consumers/{consumer}/ack", responses=WITH_BODY_ERRORS)
def ack_consumer(name: TableName, consumer: ConsumerName, body: AckIn, principal: ConsumePrincipal, catalog: CatalogDep, session: SessionDep) -> dict:
    """Move the consumer's checkpoint to `cursor` (never back)."""
    table = table_or_404(catalog, principal.tenant, name)
    store = ConsumerStore(session, principal.tenant)
    record = store.get(name, consumer)
    return _view(store.ack(table, record, Cursor.parse(body.cursor)), table)
