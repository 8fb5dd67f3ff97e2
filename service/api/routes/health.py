"""GET /healthz (alive), GET /readyz (every dependency answers), GET /metrics (operator tokens)."""

from __future__ import annotations

import grpc
from fastapi import APIRouter, Request, status
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel
from sqlalchemy import text

from service.api.deps import CatalogDep, OperatorPrincipal, SettingsDep, SyncRedisDep
from service.api.errors import AUTH_ERRORS, DESCRIPTIONS, ErrorBody
from service.core import metrics
from service.core.db import get_engine

router = APIRouter(tags=["health"])
CHECK_TIMEOUT_S = 2.0


@router.get("/healthz")
def healthz() -> dict:
    return {"status": "ok"}


def _spark_answers(remote: str | None) -> str | None:
    if not remote:
        return "CALVE_SPARK_REMOTE is not set"
    target = remote.removeprefix("sc://").split("/", 1)[0].split(";", 1)[0]
    channel = grpc.insecure_channel(target)
    try:
        grpc.channel_ready_future(channel).result(timeout=CHECK_TIMEOUT_S)
        return None
    except grpc.FutureTimeoutError:
        return f"no answer from {target}"
    finally:
        channel.close()


class Ready(BaseModel):
    status: str


class NotReady(ErrorBody):
    status: str
    missing: dict[str, str]


@router.get("/readyz", response_model=Ready, responses={503: {"model": NotReady, "description": "a dependency does not answer (named in missing)"}})
def readyz(request: Request, settings: SettingsDep, client: SyncRedisDep, catalog: CatalogDep) -> JSONResponse:
    problems: dict[str, str] = {}
    if request.app.state.draining:
        problems["api"] = "shutting down"
    try:
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure means "not ready"; the message says which
        problems["redis"] = str(exc)
    spark = _spark_answers(settings.spark_remote)
    if spark:
        problems["spark_connect"] = spark
    try:
        catalog.list_namespaces()
    except Exception as exc:  # noqa: BLE001
        problems["catalog"] = str(exc)
    try:
        with get_engine(settings.resolved_database_url()).connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception as exc:  # noqa: BLE001
        problems["metadata_db"] = str(exc)
    if problems:
        detail = "not ready: " + "; ".join(f"{part}: {problem}" for part, problem in problems.items())
        return JSONResponse(
            {"status": "unavailable", "detail": detail, "missing": problems}, status_code=status.HTTP_503_SERVICE_UNAVAILABLE
        )
    return JSONResponse({"status": "ready"})


@router.get(
    "/metrics", response_class=PlainTextResponse,
    responses={200: {"description": "Prometheus text format", "content": {"text/plain": {"schema": {"type": "string"}}}},
               # Spelled out: with a model, FastAPI would document them in the route's text/plain.
               **{code: {"description": DESCRIPTIONS[code], "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}}
                  for code in AUTH_ERRORS}},
)
def prometheus_metrics(_operator: OperatorPrincipal, client: SyncRedisDep) -> Response:
    """Every tenant's and table's series, so an operator token's only: a tenant must not learn the
    others' names or volumes (Prometheus sends it with `authorization: {credentials_file: ...}`)."""
    return Response(metrics.render(client), media_type=CONTENT_TYPE_LATEST)
