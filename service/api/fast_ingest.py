"""Ingest POSTs whose token and pipeline the api already knows, answered without FastAPI's routing.

A request of a few events cost the api ~0.6-0.8 ms of CPU, most of it FastAPI's and Starlette's
layers (routing, its dependencies solved, middlewares, exception wrappers), not its events. A POST
to a pipeline's path whose token's principal and whose pipeline are both in the api's caches, with
no query but `wait` and `timeout` in their plain spellings, is handled here by the same code the
route runs (routes/ingest.py `_ingest`), its errors answered by the app's own exception handlers.
So is a POST to a shipper's endpoint (OTLP's logs, Loki's push, Elasticsearch's `/_bulk`:
SHIPPERS) whose token is cached, by its route's own function. Anything else (an unknown or uncached token, a pipeline not looked
up yet, a draining api, any other query) goes to the app untouched, before its body is read: the
route then answers as it always did, and its lookups fill the caches for the next request. A cached token or pipeline past
half its time is looked up again in the background (RefreshAhead) by the first request that finds
it so, while the requests go on with it: an entry in use does not expire, which sent every
request in flight the route's way, each waiting on the one lookup (15-18% of `make bench`'s plain
requests: the 2 s pipeline cache expired every 2 s; 0-0.4% so).
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Awaitable, Callable
from urllib.parse import parse_qsl

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.deps import looked_up_again, lookup_principal, token_from
from service.api.routes import elastic, loki, otlp
from service.api.routes.ingest import PipelinePath, _ingest, in_flight, pipeline_at
from service.core import metrics
from service.pipelines.store import MISSING
from service.tenancy.tenants import Principal

_PATH = re.compile("/" + PipelinePath.regex)
_WAIT = {"true": True, "false": False}
_TIMEOUT = re.compile(r"[0-9]{1,5}(?:\.[0-9]{1,6})?")
MAX_TIMEOUT_S = 86400  # the route's own bound on timeout (le=86400)
KNOWN = metrics.INGEST_WAYS.labels("known")
def _query(raw: bytes, known: frozenset[str] = frozenset({"wait", "timeout"})) -> tuple[bool, float | None] | None:
    """(wait, timeout) of a query of only those two (or of `known` of them), each once and spelled
    plainly; None for any other query (the route parses it, and refuses what it must)."""
    if not raw:
        return False, None
    try:
        pairs = parse_qsl(raw.decode("ascii"), keep_blank_values=True, strict_parsing=True)
    except (UnicodeDecodeError, ValueError):
        return None
    asked = dict(pairs)
    if len(asked) != len(pairs) or not asked.keys() <= known:
        return None
    wait = _WAIT.get(asked.get("wait", "false"))
    timeout = asked.get("timeout")
    if wait is None or (timeout is not None and not (_TIMEOUT.fullmatch(timeout) and 0 < float(timeout) <= MAX_TIMEOUT_S)):
        return None
    return wait, float(timeout) if timeout is not None else None


# The shippers' endpoints, taken the same way by their routes' own functions: each with the query
# parameters it takes (OTLP's route reads `wait` and, as FastAPI does with any parameter it does
# not declare, leaves `timeout` alone: so does this way). A small OTLP export cost the api 0.70 ms
# of CPU through FastAPI's layers against 0.40 this way (make bench-api, one record a request).
Take = Callable[[Request, Principal, object, bool, float | None], Awaitable[Response]]
SHIPPERS: dict[str, tuple[Take, frozenset[str]]] = {
    "/otlp/v1/logs": (lambda request, principal, state, wait, _timeout: otlp.take_export(
        request, principal, state.buffer, state.waiter, state.limits, state.settings, wait), frozenset({"wait", "timeout"})),
    "/loki/api/v1/push": (lambda request, principal, state, _wait, _timeout: loki.take_push(
        request, principal, state.buffer, state.limits, state.settings), frozenset()),
    "/_bulk": (lambda request, principal, state, _wait, _timeout: elastic.bulk(
        request, principal, state.settings, state.buffer, state.limits, None), frozenset()),
}


class FastIngest:
    """ASGI middleware: the known ingest POSTs by `_ingest` at once (see the module's docstring).
    Sits inside BodyGuard (the body's limits and deadline apply) and outside FastAPI's exception
    middleware, so it answers its errors with the app's handlers itself."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        known = self._known(scope) if scope["type"] == "http" and scope["method"] == "POST" else None
        if known is None:
            await self.app(scope, receive, send)
            return
        principal, take, (wait, timeout) = known
        KNOWN.inc()
        request = Request(scope, receive)
        state = scope["app"].state
        try:
            with in_flight(request):
                response = await take(request, principal, state, wait, timeout)
        except Exception as exc:  # answered as the app answers it, or raised on to its server error handler
            handler = next((scope["app"].exception_handlers[kind] for kind in type(exc).__mro__ if kind in scope["app"].exception_handlers), None)
            if handler is None:
                raise
            response = await handler(request, exc) if inspect.iscoroutinefunction(handler) else await run_in_threadpool(handler, request, exc)
        await response(scope, receive, send)

    @staticmethod
    def _known(scope: Scope) -> tuple[Principal, Take, tuple[bool, float | None]] | None:
        """(the principal, what takes the request, wait and timeout) where the request is one the
        route would take and the api's caches know its token and pipeline; else None."""
        path = scope["path"]
        app = scope.get("app")
        shipper = SHIPPERS.get(path)
        if app is None or scope.get("root_path") or not (shipper or _PATH.fullmatch(path)) or app.state.draining:
            return None
        if (query := _query(scope.get("query_string", b""), *shipper[1:] if shipper else ())) is None:
            return None
        authorization = next((value for name, value in scope["headers"] if name == b"authorization"), None)
        if authorization is None or (token := token_from(authorization.decode("latin-1"))) is None:
            return None
        state = app.state
        principal = state.principals.get(token)
        if principal is None or principal.is_operator or "ingest" not in principal.scopes:
            return None
        if state.principals.due(token):
            looked_up_again(state.principals.refresh, token, functools.partial(lookup_principal, state.engine))
        if shipper:
            return principal, shipper[0], query
        record = state.pipelines.cached((principal.tenant, path))
        if record is MISSING or record is None or not principal.may_ingest_into(record.name):
            return None
        if state.pipelines.due((principal.tenant, path)):
            looked_up_again(state.pipelines.refresh, (principal.tenant, path), functools.partial(pipeline_at, state.engine, principal.tenant, path))
        return principal, functools.partial(_pipeline_request, record.name), query


async def _pipeline_request(pipeline: str, request: Request, principal: Principal, state: object, wait: bool, timeout: float | None) -> Response:
    return await _ingest(request, principal, pipeline, state.buffer, state.waiter, state.limits, state.settings, wait, timeout)
