"""GET /v1/tables, /v1/tables/{name}, /v1/tables/{name}/rows."""

from __future__ import annotations

import orjson
from fastapi import APIRouter, HTTPException, Query, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from pyiceberg.exceptions import NoSuchNamespaceError
from pyiceberg.table import Table

from service.api.deps import CatalogDep, ReadPrincipal, RedisDep, TableName
from service.api.errors import AUTH_ERRORS, error_responses
from service.core import keys
from service.iceberg.catalog import load_table

router = APIRouter(prefix="/v1/tables", tags=["tables"], responses=error_responses(*AUTH_ERRORS))
RECENT_SNAPSHOTS = 10


def _table_or_404(catalog: CatalogDep, tenant: str, name: str) -> Table:
    table = load_table(catalog, tenant, name)
    if table is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no table {name!r}")
    return table


@router.get("")
def list_tables(principal: ReadPrincipal, catalog: CatalogDep) -> dict:
    try:
        identifiers = catalog.list_tables(principal.tenant)
    except NoSuchNamespaceError:
        identifiers = []
    return {"tables": sorted(identifier[-1] for identifier in identifiers)}


SMALL_FILE_BYTES = 32 * 1024 * 1024  # a data file below this is one compaction would merge


def health(table: Table) -> dict:
    """How the table is keeping: files, snapshots, manifests and metadata size."""
    snapshot = table.current_snapshot()
    sizes = table.inspect.data_files().column("file_size_in_bytes").to_pylist() if snapshot else []
    metadata_bytes = len(table.io.new_input(table.metadata_location))
    return {
        "data_files": len(sizes),
        "avg_file_bytes": int(sum(sizes) / len(sizes)) if sizes else 0,
        "small_files": sum(1 for size in sizes if size < SMALL_FILE_BYTES),
        "snapshots": len(table.metadata.snapshots),
        "manifests": len(snapshot.manifests(table.io)) if snapshot else 0,
        "metadata_bytes": metadata_bytes,
        "oldest_snapshot_ms": min((s.timestamp_ms for s in table.metadata.snapshots), default=None),
    }


def _describe(catalog: CatalogDep, tenant: str, name: str) -> dict:
    table = _table_or_404(catalog, tenant, name)
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
        "health": health(table),
    }


@router.get("/{name}", responses=error_responses(404, 422))
async def describe_table(name: TableName, principal: ReadPrincipal, catalog: CatalogDep, client: RedisDep) -> dict:
    described = await run_in_threadpool(_describe, catalog, principal.tenant, name)
    runs = await client.hgetall(keys.upkeep_key(principal.tenant, name))
    described["health"]["upkeep"] = {task.decode(): orjson.loads(run) for task, run in sorted(runs.items())}
    return described


@router.get("/{name}/rows", responses=error_responses(404, 422))
def preview_rows(
    name: TableName,
    principal: ReadPrincipal,
    catalog: CatalogDep,
    limit: int = Query(20, ge=1, le=1000),
) -> Response:
    table = _table_or_404(catalog, principal.tenant, name)
    rows = table.scan(limit=limit).to_arrow().to_pylist()
    # orjson serialises datetimes, decimals-as-str and bytes fallbacks without a custom encoder.
    content = orjson.dumps({"rows": rows[:limit]}, default=str, option=orjson.OPT_NON_STR_KEYS)
    return Response(content, media_type="application/json")
