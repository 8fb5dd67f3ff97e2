"""GET /v1/stats: the tenant's counters and backlog now, for the console's live overview.

Tenant-scoped (a tenant sees its own pipelines and tables only), unlike /metrics. The counters
are totals since the processes started; the console samples them every few seconds and draws the
rates. Under `calve up` every role's counters are read from the shared metrics directory.
"""

from __future__ import annotations

import time

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from service.api.deps import ReadPrincipal, RedisDep
from service.api.errors import AUTH_ERRORS, error_responses
from service.core import keys, metrics

router = APIRouter(prefix="/v1/stats", tags=["stats"], responses=error_responses(*AUTH_ERRORS))


@router.get("")
async def read_stats(principal: ReadPrincipal, client: RedisDep) -> dict:
    totals = await run_in_threadpool(metrics.tenant_totals, principal.tenant)
    backlog = await client.get(keys.backlog_key(principal.tenant))
    return {"at": time.time(), "backlog_events": int(backlog or 0), **totals}
