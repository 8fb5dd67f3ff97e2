"""The api application: routers, error handlers and the lifespan of shared clients."""

from __future__ import annotations

from http import HTTPStatus

from contextlib import asynccontextmanager
from pathlib import Path

import redis
import redis.asyncio as aioredis
from fastapi import FastAPI, Request, status
from fastapi.responses import FileResponse, JSONResponse

import asyncio
import contextlib

from service.api.routes import health, ingest, receipts, tables, tenants, tokens
from service.core.keys import AUTH_CHANNEL
from service.buffer import RequestBuffer
from service.limits import TenantLimits
from service.core.config import Settings, get_settings
from service.core.db import get_engine
from service.exceptions import AlreadyExists, BadRequestBody, BodyTooLarge, InvalidName, NotFound
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
        follower = asyncio.create_task(_follow_auth_changes(app.state.redis, app.state.principals))
        try:
            yield
        finally:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower
            await app.state.waiter.stop()
            await app.state.redis.aclose()
            app.state.sync_redis.close()

    app = FastAPI(title="Calve", version="0.1.0", lifespan=lifespan)
    for router in (health.router, ingest.router, receipts.router, tables.router, tokens.router, tenants.router):
        app.include_router(router)

    @app.get("/", include_in_schema=False)
    def console() -> FileResponse:
        return FileResponse(CONSOLE_PAGE)

    for error, code in ERROR_STATUS.items():
        app.add_exception_handler(error, _answer_with(code))

    return app


async def _follow_auth_changes(client: aioredis.Redis, principals: PrincipalCache) -> None:
    """Drop every cached token when any api or CLI revokes a token or disables a tenant (and after
    each resubscription, for whatever was announced meanwhile)."""
    await follow_channel(client, AUTH_CHANNEL, lambda _data: principals.clear(), on_subscribed=principals.clear)
