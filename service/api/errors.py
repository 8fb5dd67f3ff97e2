"""One error shape for the whole API, the statuses each route declares, and the handlers that
answer with them.

Every error answer is `{"detail": "<what went wrong and what to do next>"}`, with `errors` listing
each bad field when a request or a pipeline definition has several:
`{"detail": "...", "errors": [{"field": "sinks[0].table", "error": "..."}]}`.
"""

from __future__ import annotations

import logging
import re
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from service.core.exceptions import (
    AlreadyExists,
    BadCursor,
    BadRequestBody,
    BodyTooLarge,
    ChangelogError,
    ConsumerLagging,
    DefinitionInvalid,
    HistoryExpired,
    InvalidName,
    NotFound,
    SnapshotMissing,
    SnapshotUnknown,
)

log = logging.getLogger(__name__)


class FieldError(BaseModel):
    field: str = Field(description="where: 'query.limit', 'body.scopes[0]', 'sinks[0].table'")
    error: str


class ErrorBody(BaseModel):
    detail: str = Field(description="what went wrong, and what to do next")
    errors: list[FieldError] | None = Field(None, description="each bad field, when there are several")


DESCRIPTIONS = {
    400: "malformed body (the message says where)",
    401: "missing, unknown, expired or revoked token, or a disabled tenant",
    403: "the token lacks the scope, or may not use this pipeline",
    404: "no such thing for your tenant",
    405: "the path exists, the method does not (see Allow)",
    408: "the request body did not arrive in time",
    409: "it exists already, or the table's state or history does not allow it",
    410: "the snapshots asked for were expired (the message says how to go on)",
    413: "body over a size or count limit",
    422: "a field is invalid (each one named)",
    429: "over the tenant's rate (see Retry-After)",
    503: "not available now (see Retry-After)",
}
AUTH_ERRORS = (401, 403)


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for these error statuses, all with the one error shape."""
    return {code: {"model": ErrorBody, "description": DESCRIPTIONS[code]} for code in codes}


# Calve's own errors and the status each one answers with; the message is the exception's text.
ERROR_STATUS = {
    BadRequestBody: HTTPStatus.BAD_REQUEST,
    NotFound: HTTPStatus.NOT_FOUND,
    AlreadyExists: HTTPStatus.CONFLICT,
    BodyTooLarge: HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
    InvalidName: HTTPStatus.UNPROCESSABLE_ENTITY,
    ChangelogError: HTTPStatus.CONFLICT,  # not an ancestor, delete files, a cursor behind the checkpoint
    SnapshotMissing: HTTPStatus.GONE,  # expired (or, with history expired, never one: Calve cannot tell)
    SnapshotUnknown: HTTPStatus.NOT_FOUND,
    HistoryExpired: HTTPStatus.GONE,
    ConsumerLagging: HTTPStatus.GONE,
    BadCursor: HTTPStatus.UNPROCESSABLE_ENTITY,
}


def _answer_with(code: int):  # noqa: ANN202 - an exception handler factory
    async def handler(_request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=code)

    return handler


# FastAPI's answer to a JSON body it cannot decode as text (not UTF-8, or compressed without saying so).
_UNPARSED_BODY = "There was an error parsing the body"


async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
    detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    if exc.status_code == 400 and detail == _UNPARSED_BODY:
        detail = "the body is not JSON text in UTF-8 (another encoding, or compressed without a Content-Encoding); send it as UTF-8 JSON"
    return JSONResponse({"detail": detail}, status_code=exc.status_code, headers=exc.headers)


def _field(loc: tuple[Any, ...]) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


async def _invalid_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = [{"field": _field(error["loc"]), "error": error["msg"]} for error in exc.errors()]
    first = errors[0] if errors else {"field": "request", "error": "invalid"}
    detail = f"invalid {first['field']}: {first['error']}" + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else "")
    return JSONResponse({"detail": detail, "errors": errors}, status_code=HTTPStatus.UNPROCESSABLE_ENTITY)


async def _definition_invalid(_request: Request, exc: DefinitionInvalid) -> JSONResponse:
    # Each bad field by name, with why: [{"field": "sinks[0].table", "error": "..."}].
    errors = exc.detail()
    detail = f"the pipeline definition has {len(errors)} problem{'s' if len(errors) != 1 else ''}: {errors[0]['field']}: {errors[0]['error']}"
    return JSONResponse({"detail": detail, "errors": errors}, status_code=HTTPStatus.UNPROCESSABLE_ENTITY)


async def _client_gone(request: Request, _exc: ClientDisconnect) -> Response:
    # A client that went away mid-body is a normal event for a network service: a warning, no
    # traceback; nothing of its request was accepted, and nobody reads the answer.
    log.warning("client disconnected before its body arrived: %s %s", request.method, request.url.path)
    return Response(status_code=HTTPStatus.BAD_REQUEST)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ClientDisconnect, _client_gone)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_exception_handler(DefinitionInvalid, _definition_invalid)
    for error, code in ERROR_STATUS.items():
        app.add_exception_handler(error, _answer_with(code))


def allowed_methods(request: Request) -> list[str]:
    """The methods Calve's documented routes answer at this request's path (none for an unknown
    path); the ingest catch-all (`/{path}`) does not count. Read from the OpenAPI document, which
    lists exactly the routes and methods Calve serves."""
    app = request.app
    table = getattr(app.state, "methods_by_path", None)
    if table is None:
        table = app.state.methods_by_path = [
            (re.compile("^" + re.sub(r"\\{[^}/]+\\}", "[^/]+", re.escape(path)) + "$"), sorted(m.upper() for m in item))
            for path, item in app.openapi()["paths"].items()
            if path != "/{path}"
        ]
    path = request.url.path
    return sorted({method for pattern, methods in table if pattern.fullmatch(path) for method in methods})


def method_not_allowed(request: Request) -> HTTPException | None:
    """405 with Allow when the path is one of Calve's own and the method is not."""
    allowed = allowed_methods(request)
    if not allowed:
        return None
    return HTTPException(
        HTTPStatus.METHOD_NOT_ALLOWED,
        f"{request.method} is not allowed on {request.url.path[:200]}; use {', '.join(allowed)}",
        headers={"Allow": ", ".join(allowed)},
    )
