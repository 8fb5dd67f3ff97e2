"""The api application: routers, error handlers and the lifespan of shared clients."""

from __future__ import annotations

from contextlib import asynccontextmanager
from pathlib import Path

import redis
import redis.asyncio as aioredis
from fastapi import FastAPI, Request, status
from fastapi.responses import FileResponse, JSONResponse

from service.api.routes import health, ingest, receipts, tables
from service.core.config import Settings, get_settings
from service.core.db import get_engine
from service.exceptions import BadRequestBody, BodyTooLarge
from service.receipts import ReceiptWaiter
from service.tenants import PrincipalCache

CONSOLE_PAGE = Path(__file__).resolve().parents[2] / "web" / "index.html"


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):  # noqa: ANN202
        if not settings.redis_url:
            raise RuntimeError("CALVE_REDIS_URL is not set; start everything with `calve up`, or point it at Redis")
        app.state.settings = settings
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
        await app.state.waiter.start()
        try:
            yield
        finally:
            await app.state.waiter.stop()
            await app.state.redis.aclose()
            app.state.sync_redis.close()

    app = FastAPI(title="Calve", version="0.1.0", lifespan=lifespan)
    for router in (health.router, ingest.router, receipts.router, tables.router):
        app.include_router(router)

    @app.get("/", include_in_schema=False)
    def console() -> FileResponse:
        return FileResponse(CONSOLE_PAGE)

    @app.exception_handler(BadRequestBody)
    async def _bad_body(_request: Request, exc: BadRequestBody) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=status.HTTP_400_BAD_REQUEST)

    @app.exception_handler(BodyTooLarge)
    async def _too_large(_request: Request, exc: BodyTooLarge) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)

    return app
