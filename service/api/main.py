"""The api application: routers, error handlers and the lifespan of shared clients."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
from contextlib import asynccontextmanager
from pathlib import Path

import pyarrow as pa
import redis.asyncio as aioredis
from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import FileResponse, Response

from service.api.bodies import BodyGuard
from service.api.buffer import RequestBuffer
from service.api.deps import authenticated
from service.api.errors import install_error_handlers
from service.api.fast_ingest import FastIngest
from service.api.footers import FooterReaders
from service.api.routes import (
    changes,
    dlq,
    elastic,
    files,
    health,
    ingest,
    loki,
    otlp,
    pipelines,
    receipts,
    stats,
    tables,
    tenants,
    tokens,
)
from service.api.waiter import ReceiptWaiter, follow_channel
from service.core.config import Settings, get_settings
from service.core.connections import async_redis_client, redis_client
from service.core.db import get_engine
from service.core.exceptions import NotFound
from service.core.keys import AUTH_CHANNEL, PIPELINES_CHANNEL
from service.pipelines.spec import PipelineDefinition
from service.pipelines.store import PipelineCache
from service.tenancy.limits import TenantLimits
from service.tenancy.tenants import PrincipalCache
from spark_jobs.files import freeze_once

log = logging.getLogger(__name__)
CONSOLE_DIR = Path(__file__).resolve().parents[2] / "web"
# FastAPI's own OpenTelemetry instrumentation (from 0.16x) asks OpenTelemetry's global providers on
# every request whether anything listens (~5% of the api's CPU for a request of 20 events); Calve
# sets none (its metrics are Prometheus's), so it is off where this FastAPI has it.
NO_TELEMETRY = {"telemetry": {"tracing": False, "metrics": False, "logs": False}} if "telemetry" in inspect.signature(FastAPI).parameters else {}
CONSOLE_PAGE = CONSOLE_DIR / "index.html"
# The console runs no inline script and loads nothing from elsewhere: whatever an event or a name
# holds, it cannot run as script in the page that shows it.
CONSOLE_ASSETS = {"console.js": "text/javascript", "console.css": "text/css"}
CONSOLE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def use_jemalloc_for_arrow() -> None:
    """Arrow's buffers from jemalloc, where this pyarrow has it: with its default (mimalloc) an
    api serving a 1,000,000-row initial load grew by 44 MiB, with jemalloc by 24 MiB."""
    try:
        pa.set_memory_pool(pa.jemalloc_memory_pool())
    except NotImplementedError:
        pass


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    use_jemalloc_for_arrow()

    @asynccontextmanager
    async def lifespan(app: FastAPI):  # noqa: ANN202
        if not settings.redis_url:
            raise RuntimeError("CALVE_REDIS_URL is not set; start everything with `calve up`, or point it at Redis")
        app.state.settings = settings
        app.state.draining = False  # set on SIGTERM by service.api.server.DrainingServer
        app.state.in_flight = 0  # ingest requests being answered
        app.state.engine = get_engine(settings.resolved_database_url())
        # Authenticated tokens, kept briefly so that a request does not cost a DB query; a
        # revoked or disabled token stops working here within auth_cache_s.
        app.state.principals = PrincipalCache(settings.auth_cache_s)
        app.state.pipelines = PipelineCache(settings.pipeline_cache_s)
        # A blocking pool: under a burst, requests queue for a connection instead of failing.
        app.state.redis = async_redis_client(settings)
        app.state.sync_redis = redis_client(settings, socket_timeout=5)
        app.state.waiter = ReceiptWaiter(app.state.redis)
        app.state.limits = TenantLimits(app.state.redis, settings.rate_burst_s)
        app.state.buffer = RequestBuffer(app.state.redis, settings)
        app.state.footers = FooterReaders(settings.registration_processes, settings.registration_max_footer_bytes)
        await app.state.waiter.start()
        followers = [
            asyncio.create_task(_follow_auth_changes(app.state.redis, app.state.principals)),
            asyncio.create_task(_follow_pipeline_changes(app.state.redis, app.state.pipelines)),
        ]
        freeze_once()  # what starting made stays for good: full collections no longer walk it
        log.info("api started (pid %d)", os.getpid())  # its connections are accepted from here on
        try:
            yield
        finally:
            for follower in followers:
                follower.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await follower
            await app.state.waiter.stop()
            await app.state.redis.aclose()
            app.state.sync_redis.close()
            app.state.footers.close()

    app = FastAPI(title="Calve", version="0.1.0", lifespan=lifespan, **NO_TELEMETRY)

    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def console(request: Request) -> Response:
        """The console to a browser; to any other client, the cluster info Elasticsearch shippers
        probe before they send to `_bulk` (routes/elastic.py). A token sent with the probe is
        checked (401 if it is wrong), so a shipper's start-up check fails on a wrong token, not its
        first `_bulk`."""
        if "text/html" in request.headers.get("accept", ""):
            return FileResponse(CONSOLE_PAGE, headers=CONSOLE_HEADERS)
        if request.headers.get("authorization"):
            await authenticated(request)
        return elastic.cluster_info()

    @app.get("/console/{name}", include_in_schema=False)
    def console_asset(name: str) -> Response:
        """The console's script and style sheet (web/console.js, web/console.css), nothing else."""
        if name not in CONSOLE_ASSETS:
            raise NotFound(f"no console file {name!r}")
        return FileResponse(CONSOLE_DIR / name, media_type=CONSOLE_ASSETS[name], headers=CONSOLE_HEADERS)

    # The ingest router last: it answers POST on any path that is not one of Calve's own. Its
    # route for the paths a pipeline may have first: matched at once (routes/ingest.py).
    app.include_router(ingest.pipeline_router)
    routers = (health, receipts, stats, tables, files, changes, tokens, tenants, pipelines, dlq, elastic, otlp, loki, ingest)
    for router in (module.router for module in routers):
        app.include_router(router)

    install_error_handlers(app)
    app.openapi = lambda: _openapi_with_definitions(app)
    app.add_middleware(FastIngest)  # (inside BodyGuard: added before it)
    # Every body bounded by the largest any route takes; each route applies its own limit too.
    app.add_middleware(
        BodyGuard, max_bytes=max(settings.max_body_bytes, pipelines.MAX_DEFINITION_BYTES, 1024 * 1024), timeout_s=settings.body_timeout_s
    )

    return app


def _openapi_with_definitions(app: FastAPI) -> dict:
    """FastAPI's document, plus the schema of a pipeline definition: the pipeline routes read
    their body by hand (JSON or YAML) and only refer to it."""
    if app.openapi_schema is None:
        document = get_openapi(title=app.title, version=app.version, routes=app.routes)
        schema = PipelineDefinition.model_json_schema(ref_template="#/components/schemas/{model}")
        components = document.setdefault("components", {}).setdefault("schemas", {})
        components.update(schema.pop("$defs", {}))
        components["PipelineDefinition"] = schema
        app.openapi_schema = document
    return app.openapi_schema


async def _follow_auth_changes(client: aioredis.Redis, principals: PrincipalCache) -> None:
    """Drop every cached token when any api or CLI revokes a token or disables a tenant (and after
    each resubscription, for whatever was announced meanwhile)."""
    await follow_channel(client, AUTH_CHANNEL, lambda _data: principals.clear(), on_subscribed=principals.clear)


async def _follow_pipeline_changes(client: aioredis.Redis, cache: PipelineCache) -> None:
    await follow_channel(client, PIPELINES_CHANNEL, lambda _data: cache.clear(), on_subscribed=cache.clear)
