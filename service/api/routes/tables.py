"""GET /v1/tables, /v1/tables/{name} (with health), /v1/tables/{name}/rows, upkeep by hand
(POST /v1/tables/{name}/maintenance), and the dead commit entries of a table."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Annotated, Literal

import orjson
from fastapi import APIRouter, HTTPException, Path, Query, status
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from pyiceberg.exceptions import NoSuchNamespaceError
from pyiceberg.expressions import AlwaysTrue, BooleanExpression
from pyiceberg.table import Table
from pyparsing import ParseException

from service.api.deps import (
    AdminPrincipal,
    CatalogDep,
    ReadPrincipal,
    RedisDep,
    SettingsDep,
    TableName,
    table_or_404,
)
from service.api.errors import AUTH_ERRORS, error_responses
from service.core import keys
from service.iceberg.catalog import calve_table_name, table_identifier
from service.iceberg.compaction import SMALL_FILE_RATIO, CompactionPolicy
from service.iceberg.row_filters import FilterError, row_filter
from service.protocol import commit_entry
from service.protocol.upkeep import UpkeepRun

router = APIRouter(prefix="/v1/tables", tags=["tables"], responses=error_responses(*AUTH_ERRORS))
RECENT_SNAPSHOTS = 10


MAX_DESCRIBED_TABLES = 500  # ?describe=true opens each table: a bound on one request's work


@router.get("", responses=error_responses(422))
def list_tables(
    principal: ReadPrincipal, catalog: CatalogDep,
    describe: bool = Query(False, description=f"also each table's rows, bytes, data files and last commit (the first {MAX_DESCRIBED_TABLES})"),
) -> dict:
    try:
        identifiers = catalog.list_tables(principal.tenant)
    except NoSuchNamespaceError:
        identifiers = []
    names = sorted(calve_table_name(catalog, identifier[-1]) for identifier in identifiers)
    if not describe:
        return {"tables": names}
    return {"tables": names, "described": [_summary(catalog, principal.tenant, name) for name in names[:MAX_DESCRIBED_TABLES]]}


def _summary(catalog, tenant: str, name: str) -> dict:  # noqa: ANN001 - a pyiceberg Catalog
    """A table's size now, from its current snapshot's summary (no manifest is read)."""
    try:
        snapshot = catalog.load_table(table_identifier(catalog, tenant, name)).current_snapshot()
    except Exception:  # noqa: BLE001 - dropped meanwhile, or unreadable: listed without numbers
        return {"name": name}
    totals = snapshot.summary if snapshot is not None and snapshot.summary is not None else {}
    number = lambda key: int(totals[key]) if key in totals else (0 if snapshot is None else None)  # noqa: E731
    return {
        "name": name, "rows": number("total-records"), "bytes": number("total-files-size"),
        "data_files": number("total-data-files"), "last_commit_ms": snapshot.timestamp_ms if snapshot is not None else None,
    }


def health(table: Table, policy: CompactionPolicy) -> dict:
    """How the table is keeping: files, snapshots, manifests and metadata size."""
    snapshot = table.current_snapshot()
    manifests = snapshot.manifests(table.io) if snapshot else []
    # A snapshot with no manifests (a table emptied by purges, say) has no files; pyiceberg's
    # data_files() fails on it instead of answering none.
    files = table.inspect.files().select(["content", "file_size_in_bytes", "record_count"]).to_pylist() if manifests else []
    sizes = [file["file_size_in_bytes"] for file in files if file["content"] == 0]
    rows = sum(file["record_count"] for file in files if file["content"] == 0)
    deleted = sum(file["record_count"] for file in files if file["content"] == 1)  # position deletes: a row each
    metadata_bytes = len(table.io.new_input(table.metadata_location))
    small = policy.for_table(table).target_file_bytes * SMALL_FILE_RATIO  # what compaction would merge
    return {
        "data_files": len(sizes),
        "avg_file_bytes": int(sum(sizes) / len(sizes)) if sizes else 0,
        "small_files": sum(1 for size in sizes if size < small),
        # merge-on-read: delete files, the rows they delete, and their share of the data files' rows
        "delete_files": sum(1 for file in files if file["content"] != 0),
        "deleted_rows": deleted,
        "deleted_share": round(deleted / rows, 4) if rows else 0.0,
        "snapshots": len(table.metadata.snapshots),
        "manifests": len(manifests),
        "metadata_bytes": metadata_bytes,
        "oldest_snapshot_ms": min((s.timestamp_ms for s in table.metadata.snapshots), default=None),
    }


def _describe(catalog: CatalogDep, tenant: str, name: str, policy: CompactionPolicy) -> dict:
    table = table_or_404(catalog, tenant, name)
    snapshots = sorted(table.metadata.snapshots, key=lambda s: s.timestamp_ms, reverse=True)[:RECENT_SNAPSHOTS]
    return {
        "name": name,
        "location": table.location(),
        "schema": orjson.loads(table.schema().model_dump_json()),
        "partition_spec": orjson.loads(table.spec().model_dump_json()),
        "current_snapshot_id": table.metadata.current_snapshot_id,
        "snapshots": [
            {
                "snapshot_id": snapshot.snapshot_id,
                "parent_snapshot_id": snapshot.parent_snapshot_id,
                "timestamp_ms": snapshot.timestamp_ms,
                "summary": snapshot.summary.model_dump() if snapshot.summary else {},
            }
            for snapshot in snapshots
        ],
        "health": health(table, policy),
    }


@router.get("/{name}", responses=error_responses(404, 422))
async def describe_table(name: TableName, principal: ReadPrincipal, catalog: CatalogDep, client: RedisDep, settings: SettingsDep) -> dict:
    policy = CompactionPolicy.from_settings(settings)
    described = await run_in_threadpool(_describe, catalog, principal.tenant, name, policy)
    runs = await client.hgetall(keys.upkeep_key(principal.tenant, name))
    described["health"]["upkeep"] = {task.decode(): UpkeepRun.from_json(run).to_dict() for task, run in sorted(runs.items())}
    return described


@router.get("/{name}/rows", responses=error_responses(404, 422))
def preview_rows(
    name: TableName,
    principal: ReadPrincipal,
    catalog: CatalogDep,
    limit: int = Query(20, ge=1, le=1000),
    filter: str | None = Query(  # noqa: A002 - the query parameter's name
        None, max_length=2000, examples=["level = 'error' and status >= 500"],
        description="only rows that match: comparisons (= != < <= > >=), in (...), is null, like 'prefix%', "
                    "between, joined with and, or, not; strings in single quotes. A column the table lacks is NULL in "
                    "every row: the answer names it in missing_columns",
    ),
) -> Response:
    table = table_or_404(catalog, principal.tenant, name)
    expression, missing = _row_filter(table, filter)
    rows = table.scan(row_filter=expression, limit=limit).to_arrow().to_pylist(maps_as_pydicts="lossy")
    answer: dict = {"rows": rows[:limit]}
    if missing:
        answer["missing_columns"] = missing
        answer["note"] = (f"table {name!r} has no column {', '.join(map(repr, missing))}: NULL in every row (a field that has "
                          f"not arrived, or a misspelling); its columns are {', '.join(table.schema().column_names)}")
    # orjson serialises datetimes, decimals-as-str and bytes fallbacks without a custom encoder.
    content = orjson.dumps(answer, default=str, option=orjson.OPT_NON_STR_KEYS)
    return Response(content, media_type="application/json")


def _row_filter(table: Table, text: str | None) -> tuple[BooleanExpression, list[str]]:
    """The filter bound to the table's columns and the columns it names that the table lacks
    (NULL in every row), or a 422 naming what is wrong."""
    if not text or not text.strip():
        return AlwaysTrue(), []
    example = "e.g. level = 'error' and status >= 500"
    try:
        return row_filter(table.schema(), text)
    except ParseException as exc:
        problem = f"not a row filter at character {exc.loc + 1} (near {text[exc.loc:exc.loc + 20]!r}); {example}"
    except FilterError as exc:
        problem = str(exc)
    except RecursionError:
        problem = f"a row filter nested too deep; {example}"
    except (ValueError, TypeError) as exc:  # a LIKE with a leading wildcard, a literal the column's type cannot take
        problem = f"{exc}; the columns are {', '.join(table.schema().column_names)}"
    raise RequestValidationError([{"loc": ("query", "filter"), "msg": problem, "type": "value_error"}])


# -- commit-stream entries the committer gave up on ---------------------------------------------

# A Redis stream id: two unsigned 64-bit numbers; 19 digits always fit (20 may not).
EntryId = Annotated[str, Path(pattern=r"^[0-9]{1,19}-[0-9]{1,19}$", description="id of a dead commit entry")]
DEAD_FIELDS = (commit_entry.DEAD_REASON, commit_entry.DEAD_AT, commit_entry.DEAD_ENTRY)


def _dead_entry(entry_id: bytes, fields: dict[bytes, bytes]) -> dict:
    get = lambda name: fields.get(name.encode(), b"").decode()  # noqa: E731
    return {
        "id": entry_id.decode(),
        "reason": get(commit_entry.DEAD_REASON),
        "failed_at": float(get(commit_entry.DEAD_AT) or 0),
        "commit_entry": get(commit_entry.DEAD_ENTRY),
        "files": orjson.loads(get(commit_entry.FILES) or "[]"),
        "rows_by_receipt": orjson.loads(get(commit_entry.RECEIPTS) or "{}"),
    }


@router.get("/{name}/dead-commits", responses=error_responses(404, 422))
async def list_dead_commits(name: TableName, principal: ReadPrincipal, catalog: CatalogDep, client: RedisDep) -> dict:
    """Files whose commit can never succeed (a file gone, a schema the table refuses), with why;
    their receipts are failed. Retry one once its cause is fixed, or discard it. A table that does
    not exist is a 404, as on every table route, unless it has such entries (its files were written
    for a table since dropped): they stay visible, to be discarded."""
    raw = await client.xrange(keys.dead_commit_stream_key(principal.tenant, name), count=1000)
    if not raw:
        await run_in_threadpool(table_or_404, catalog, principal.tenant, name)
    return {"entries": [_dead_entry(entry_id, fields) for entry_id, fields in raw]}


@router.post("/{name}/dead-commits/{entry_id}/retry", responses=error_responses(404, 422))
async def retry_dead_commit(name: TableName, entry_id: EntryId, principal: AdminPrincipal, client: RedisDep) -> dict:
    """Put the entry back on the table's commit stream: the leader commits it with the next ones.
    Its receipts stay failed (their producers were told); the rows are committed."""
    dead = keys.dead_commit_stream_key(principal.tenant, name)
    raw = await client.xrange(dead, min=entry_id, max=entry_id)
    if not raw:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no dead commit entry {entry_id!r} of table {name!r}")
    fields = {key: value for key, value in raw[0][1].items() if key.decode() not in DEAD_FIELDS}
    async with client.pipeline(transaction=True) as pipe:
        pipe.xadd(keys.commit_stream_key(principal.tenant, name), fields)
        pipe.xdel(dead, entry_id)
        new_id, _deleted = await pipe.execute()
    await client.sadd(keys.TABLES, keys.member(principal.tenant, name))
    return {"retried": entry_id, "commit_entry": new_id.decode()}


@router.delete("/{name}/dead-commits/{entry_id}", responses=error_responses(404, 422))
async def discard_dead_commit(name: TableName, entry_id: EntryId, principal: AdminPrincipal, client: RedisDep) -> dict:
    """Forget the entry; its files are never committed."""
    if not await client.xdel(keys.dead_commit_stream_key(principal.tenant, name), entry_id):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no dead commit entry {entry_id!r} of table {name!r}")
    return {"discarded": entry_id}


# -- upkeep by hand -------------------------------------------------------------------------------

UpkeepTask = Literal["compact", "expire", "orphans", "manifests"]


class MaintenanceRequest(BaseModel):
    tasks: list[UpkeepTask] = Field(min_length=1, max_length=4, description="upkeep tasks to run now")
    wait_s: float = Field(30.0, ge=0, le=300, description="how long to wait for their outcome")


@router.post("/{name}/maintenance", responses=error_responses(400, 404, 413, 422) | {202: {"description": "still running after wait_s"}})
async def run_maintenance(
    name: TableName, body: MaintenanceRequest, principal: AdminPrincipal, catalog: CatalogDep, client: RedisDep,
) -> JSONResponse:
    """Run upkeep tasks now, through the table's leader (as it runs them on its own schedule),
    and answer what each did: 200 when all finished within `wait_s`, else 202 with those that did
    (the rest go on; their outcome shows in the table's health). `compact` merges any partition's
    small files (two are enough), `expire` applies the expiry policy, `orphans` deletes
    unreferenced files past the safety age, `manifests` merges the manifests."""
    await run_in_threadpool(table_or_404, catalog, principal.tenant, name)
    request, tasks = uuid.uuid4().hex, sorted(set(body.tasks))
    member = keys.member(principal.tenant, name)
    # The tasks first, then the registries the leaders scan (another cluster slot): a leader that
    # finds the table there finds its tasks.
    await client.hset(keys.maintenance_key(principal.tenant, name), mapping=dict.fromkeys(tasks, request))
    await client.sadd(keys.MAINTENANCE, member)
    await client.sadd(keys.TABLES, member)
    deadline = time.monotonic() + body.wait_s
    while True:
        runs = await client.hgetall(keys.upkeep_key(principal.tenant, name))
        done = {}
        for task in tasks:
            raw = runs.get(task.encode())
            run = UpkeepRun.from_json(raw) if raw is not None else None
            # A compaction is first "requested" (a writer runs it on Spark), then ok, dropped or failed.
            if run is not None and run.request == request and run.settled:
                done[task] = run.to_dict()
        if len(done) == len(tasks) or time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.2)
    pending = [task for task in tasks if task not in done]
    return JSONResponse(
        {"request": request, "tasks": done, "pending": pending},
        status_code=status.HTTP_202_ACCEPTED if pending else status.HTTP_200_OK,
    )
