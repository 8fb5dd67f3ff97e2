"""The api application: routers, error handlers and the lifespan of shared clients."""

from __future__ import annotations

import asyncio
import contextlib
from contextlib import asynccontextmanager
from http import HTTPStatus
from pathlib import Path

import redis
import redis.asyncio as aioredis
from fastapi import FastAPI, Request, status
from fastapi.responses import FileResponse, JSONResponse

from service.api.routes import dlq, health, ingest, pipelines, receipts, tables, tenants, tokens
from service.buffer import RequestBuffer
from service.core.config import Settings, get_settings
from service.core.db import get_engine
from service.core.keys import AUTH_CHANNEL, PIPELINES_CHANNEL
from service.exceptions import AlreadyExists, BadRequestBody, BodyTooLarge, InvalidName, NotFound
from service.limits import TenantLimits
from service.pipeline_spec import DefinitionInvalid
from service.pipelines import PipelineCache
from service.receipts import ReceiptWaiter, follow_channel
from service.tenants import PrincipalCache


# Calve's own errors and the status each one answers with; the message is the exception's text.
ERROR_STATUS = {
    BadRequestBody: status.HTTP_400_BAD_REQUEST,
    NotFound: status.HTTP_404_NOT_FOUND,
    AlreadyExists: status.HTTP_409_CONFLICT,
    BodyTooLarge: HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
    InvalidName: HTTPStatus.UNPROCESSABLE_ENTITY,
}


def _answer_with(code: int):  # noqa: ANN202 - an exception handler factory
    async def handler(_request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=code)

    return handler



async def _definition_invalid(_request: Request, exc: DefinitionInvalid) -> JSONResponse:
    # Each bad field by name, with why: [{"field": "sinks[0].table", "error": "..."}].
    return JSONResponse({"detail": exc.detail()}, status_code=HTTPStatus.UNPROCESSABLE_ENTITY)


CONSOLE_PAGE = Path(__file__).resolve().parents[2] / "web" / "index.html"


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

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
        pool = aioredis.BlockingConnectionPool.from_url(
            settings.redis_url, max_connections=settings.redis_max_connections, timeout=10
        )
        app.state.redis = aioredis.Redis(connection_pool=pool)
        app.state.sync_redis = redis.Redis.from_url(settings.redis_url, socket_timeout=5)
        app.state.waiter = ReceiptWaiter(app.state.redis)
        app.state.limits = TenantLimits(app.state.redis, settings.rate_burst_s)
        app.state.buffer = RequestBuffer(app.state.redis, settings)
        await app.state.waiter.start()
        followers = [
            asyncio.create_task(_follow_auth_changes(app.state.redis, app.state.principals)),
            asyncio.create_task(_follow_pipeline_changes(app.state.redis, app.state.pipelines)),
        ]
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

    app = FastAPI(title="Calve", version="0.1.0", lifespan=lifespan)

    @app.get("/", include_in_schema=False)
    def console() -> FileResponse:
        return FileResponse(CONSOLE_PAGE)

    # The ingest router last: it answers POST on any path that is not one of Calve's own.
    for router in (health.router, receipts.router, tables.router, tokens.router, tenants.router, pipelines.router, dlq.router, ingest.router):
        app.include_router(router)

    for error, code in ERROR_STATUS.items():
        app.add_exception_handler(error, _answer_with(code))
    app.add_exception_handler(DefinitionInvalid, _definition_invalid)

    return app


async def _follow_auth_changes(client: aioredis.Redis, principals: PrincipalCache) -> None:
    """Drop every cached token when any api or CLI revokes a token or disables a tenant (and after
    each resubscription, for whatever was announced meanwhile)."""
    await follow_channel(client, AUTH_CHANNEL, lambda _data: principals.clear(), on_subscribed=principals.clear)


async def _follow_pipeline_changes(client: aioredis.Redis, cache: PipelineCache) -> None:
    await follow_channel(client, PIPELINES_CHANNEL, lambda _data: cache.clear(), on_subscribed=cache.clear)
