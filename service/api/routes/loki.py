"""POST /loki/api/v1/push: Grafana Loki's push API, for Promtail, Alloy, and the `loki` outputs of
Vector and Fluent Bit.

Point the client at `http://calve:8000` (or the full `.../loki/api/v1/push`) with the token as a
Bearer token, or as the Basic auth password. JSON bodies (gzip or not) and snappy-compressed
protobuf are taken; each log line becomes an event of the tenant's `loki_logs` pipeline
(service/pipelines/loki.py), whose processors, routes, table and DLQ apply. 204 once buffered, as
Loki answers.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, status
from fastapi.responses import Response

from service.api.buffer import RequestBuffer
from service.api.deps import BufferDep, IngestPrincipal, LimitsDep, SettingsDep
from service.api.errors import AUTH_ERRORS, error_responses
from service.api.events import MAX_FIELD_NAME, ParsedBody, event_lines, media_type, parsed_body, too_many_events
from service.api.routes.ingest import ROUTED, accept_converted
from service.core.config import Settings
from service.core.exceptions import BadRequestBody, LokiError
from service.core.keys import LOKI_LOGS_PIPELINE
from service.pipelines import loki
from service.tenancy.limits import TenantLimits
from service.tenancy.tenants import Principal

router = APIRouter(tags=["loki"])
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
# A push under this size is converted on the event loop (~4 microseconds a line: ~0.3 ms at most
# for JSON), cheaper than its trip to the parsing thread; a larger one in the parsing thread, in
# its tenant's turn (routes/otlp.py INLINE_BELOW says why). Snappy's protobuf unpacks to at most
# ~20 times its size.
INLINE_BELOW = {JSON: 8 << 10, PROTOBUF: 2 << 10}
STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
LOKI_BODY = {
    "requestBody": {
        "required": True,
        "description": 'Loki push JSON ({"streams": [{"stream": {labels}, "values": [["<unix ns>", "<line>"]]}]}), '
                       "or a snappy-compressed logproto.PushRequest",
        "content": {
            JSON: {"schema": {"type": "object", "required": ["streams"], "properties": {"streams": {"type": "array", "items": {
                "type": "object", "required": ["stream", "values"], "properties": {
                    "stream": STRINGS,
                    "values": {"type": "array", "items": {"type": "array", "minItems": 2, "items": False, "prefixItems": [
                        {"type": "string", "pattern": "^[0-9]{1,19}$"}, {"type": "string"}, STRINGS,
                    ]}},
                }}}}}},
            PROTOBUF: {"schema": {"type": "string", "format": "binary"}},
        },
    }
}


@router.post(
    "/loki/api/v1/push", status_code=status.HTTP_204_NO_CONTENT, openapi_extra=LOKI_BODY,
    responses={204: {"description": "the lines are buffered (durable in Redis)"}, **error_responses(*AUTH_ERRORS, 400, 413, 429, 503)},
)
async def push(request: Request, principal: IngestPrincipal, buffer: BufferDep, limits: LimitsDep, settings: SettingsDep) -> Response:
    ROUTED.inc()
    return await take_push(request, principal, buffer, limits, settings)


async def take_push(request: Request, principal: Principal, buffer: RequestBuffer, limits: TenantLimits, settings: Settings) -> Response:
    """The push's answer, as routed or as FastIngest takes it (service/api/fast_ingest.py)."""
    kind = media_type(request.headers.get("content-type", ""))
    if kind not in (PROTOBUF, JSON):
        raise BadRequestBody(f"unsupported Content-Type {kind!r}: Loki's push API takes {JSON} or snappy-compressed {PROTOBUF}")
    protobuf = kind == PROTOBUF
    await accept_converted(
        request, principal, buffer, limits, settings, LOKI_LOGS_PIPELINE,
        lambda body: parsed_push(body, protobuf, settings.max_decompressed_bytes, settings.max_events_per_request), inline_below=INLINE_BELOW[kind],
    )
    return Response(status_code=status.HTTP_204_NO_CONTENT)


def parsed_push(body: bytes, protobuf: bool, max_bytes: int, max_events: int) -> ParsedBody | None:
    """A push request's lines as the writer's lines: each line's event as its JSON text, put
    together from its parts (loki.event_texts: a stream's labels encoded once). A Loki push cost
    the api twice a plain body's CPU per event when each line was a dict checked and encoded as a
    request's event is (make bench-api); the lines are the same. None for a push of no lines."""
    try:
        texts = loki.event_texts(body, protobuf, max_bytes, lambda key: len(key) <= MAX_FIELD_NAME)
        lines = [line for text in texts for line in ([text] if isinstance(text, bytes) else event_lines(text))]
    except LokiError as exc:
        raise BadRequestBody(str(exc)) from None
    if len(lines) > max_events:
        raise too_many_events(max_events)
    return parsed_body(lines) if lines else None
