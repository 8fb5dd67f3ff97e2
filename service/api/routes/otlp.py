"""POST /otlp/v1/logs: OpenTelemetry's OTLP/HTTP logs export, for SDKs and Collectors.

Point an exporter at `http://calve:8000/otlp` (it adds `/v1/logs`) with the header
`Authorization: Bearer <token>`. The body is an `ExportLogsServiceRequest` in protobuf
(`application/x-protobuf`) or in the OTLP JSON mapping (`application/json`), gzip or not; each
LogRecord becomes an event of the tenant's `otel_logs` pipeline (service/pipelines/otel.py), so its
processors, routes, table and DLQ apply as to any request. The answer is an
`ExportLogsServiceResponse` in the request's encoding once the records are buffered; with
`?wait=true` (in the endpoint URL) once they are committed, and then `partial_success` counts the
records that went to the DLQ. 429 and 503 carry `Retry-After`, which exporters honour by retrying.
"""

from __future__ import annotations

import time

import orjson
from fastapi import APIRouter, Query, Request
from fastapi.responses import Response
from google.protobuf import json_format
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse

from service.api import otlp_columns
from service.api.buffer import RequestBuffer
from service.api.deps import BufferDep, IngestPrincipal, LimitsDep, SettingsDep, WaiterDep
from service.api.errors import AUTH_ERRORS, error_responses
from service.api.events import ParsedBody, media_type
from service.api.routes.ingest import ROUTED, accept_converted
from service.api.waiter import ReceiptWaiter
from service.core import metrics
from service.core.config import Settings
from service.core.exceptions import BadRequestBody, OtlpError
from service.core.keys import OTEL_LOGS_PIPELINE
from service.pipelines import otel
from service.protocol.receipts import COMMITTED, FAILED
from service.tenancy.limits import TenantLimits
from service.tenancy.tenants import Principal

router = APIRouter(tags=["otlp"])
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
# A small export is read record by record: reading one column by column costs ~1.4 ms whatever it
# holds (pyarrow's reader and ~80 compute calls), record by record ~8 microseconds a record (and a
# short-way task ~2 more to read its lines), so the columns pay from ~200 records on. Measured in
# one process on make bench's records (three attributes each, ~320 bytes in JSON, ~135 in
# protobuf): one record cost the api 1.6 ms column by column against 0.016 record by record; 100
# records 2.5 against 1.3 (JSON), 1.7 against 0.8 (protobuf); 1,000 records 4.5 against 14.5 and
# 3.0 against 9.7. Small is counted in records where protobuf has parsed them, in objects (JSON's
# braces, ~8 a record: each attribute is two) before JSON is parsed.
COLUMNS_FROM_RECORDS = 200
COLUMNS_FROM_OBJECTS = 8 * COLUMNS_FROM_RECORDS
# An export under this size (~20 records) is converted on the event loop: record by record it
# costs less than the trip to the parsing thread (~0.2 ms at most). A larger one is converted in
# the parsing thread, in its tenant's turn: converted on the loop, a flood of 190-record exports
# (61 KB) took another tenant's POSTs from 2 to 41 ms (p50; p99 5 to 105 ms), as a flood of
# 1,000-event NDJSON bodies on the loop did until those too went to the thread while another
# tenant sends (bodies.parsed_off_loop).
INLINE_BELOW = {JSON: 8 << 10, PROTOBUF: 4 << 10}

OTLP_BODY = {
    "requestBody": {
        "required": True,
        "description": "an OTLP ExportLogsServiceRequest: protobuf, or the OTLP JSON mapping; Content-Encoding: gzip is accepted",
        "content": {
            PROTOBUF: {"schema": {"type": "string", "format": "binary"}},
            # The message's structure is protobuf's (opentelemetry-proto), not restated in JSON
            # Schema: parsing checks it, and an object that is not an export request is a 400.
            JSON: {"schema": {"type": "object", "description": "the OTLP JSON mapping of ExportLogsServiceRequest: {resourceLogs: [...]}"}},
        },
    }
}


def _encode(message: ExportLogsServiceResponse, json: bool) -> Response:
    if json:
        return Response(orjson.dumps(json_format.MessageToDict(message)), media_type=JSON)
    return Response(message.SerializeToString(), media_type=PROTOBUF)


@router.post(
    "/otlp/v1/logs", openapi_extra=OTLP_BODY,
    responses={
        200: {"description": "an ExportLogsServiceResponse in the request's encoding",
              "content": {PROTOBUF: {"schema": {"type": "string", "format": "binary"}}, JSON: {"schema": {"type": "object"}}}},
        **error_responses(*AUTH_ERRORS, 400, 413, 422, 429, 503),
    },
)
async def export_logs(
    request: Request, principal: IngestPrincipal, buffer: BufferDep, waiter: WaiterDep, limits: LimitsDep, settings: SettingsDep,
    wait: bool = Query(False, description="answer once the records are committed; partial_success then counts DLQ'd records"),
) -> Response:
    ROUTED.inc()
    return await take_export(request, principal, buffer, waiter, limits, settings, wait)


async def take_export(
    request: Request, principal: Principal, buffer: RequestBuffer, waiter: ReceiptWaiter, limits: TenantLimits, settings: Settings, wait: bool,
) -> Response:
    """The export's answer, as routed or as FastIngest takes it (service/api/fast_ingest.py)."""
    kind = media_type(request.headers.get("content-type", ""))
    if kind not in (PROTOBUF, JSON):
        raise BadRequestBody(f"unsupported Content-Type {kind!r}: OTLP/HTTP sends {PROTOBUF} or {JSON}")
    json = kind == JSON
    received_ns = time.time_ns()
    refused: list[str] = []
    receipt_id = await accept_converted(request, principal, buffer, limits, settings, OTEL_LOGS_PIPELINE,
                                        lambda body: _events(body, json, received_ns, refused, settings.max_events_per_request),
                                        inline_below=INLINE_BELOW[kind])
    answer = ExportLogsServiceResponse()
    if refused:
        # Records Calve could not read are rejected now, whatever becomes of the others.
        metrics.REQUESTS_REJECTED.labels(principal.tenant, "otlp_record_unreadable").inc(len(refused))
        answer.partial_success.rejected_log_records = len(refused)
        answer.partial_success.error_message = f"{len(refused)} log records could not be read and were not accepted: {_listed(refused)}"
    if receipt_id is None:
        return _encode(answer, json)
    wait_s = min(settings.wait_timeout_s, settings.max_wait_timeout_s)
    receipt = await waiter.wait(principal.tenant, receipt_id, wait_s) if wait else None
    said = []
    if wait and receipt is not None and receipt.status == FAILED:
        answer.partial_success.rejected_log_records += receipt.events
        said.append(f"the records cannot be committed: {receipt.error}")
    elif wait and (receipt is None or receipt.status != COMMITTED):
        # Buffered, not committed in time: still a success (sent again, it would be written twice).
        said.append(f"accepted as receipt {receipt_id}, not yet committed; GET /v1/receipts/{receipt_id} tells when it is")
    elif receipt is not None and (dead := receipt.public()["dlq_events"]):
        answer.partial_success.rejected_log_records += dead
        said.append(f"{dead} log records went to the dead-letter queue; GET /v1/dlq?pipeline={OTEL_LOGS_PIPELINE} says why")
    if said:
        answer.partial_success.error_message = "; ".join(filter(None, [answer.partial_success.error_message, *said]))
    return _encode(answer, json)


def _events(body: bytes, json: bool, received_ns: int, refused: list[str], max_events: int) -> list[dict] | ParsedBody:
    """The export's records as events (or as the writer's lines already); why each record left out
    was refused, in `refused` (all of them refused: the export is a 400 saying why). JSON as
    exporters write it is read column by column (otlp_columns), else record by record
    (otel.json_events); anything else through protobuf's classes, whose fields are then read
    column by column too where they can be; a small export (COLUMNS_FROM_RECORDS) record by
    record only, the same events either way (tests/unit/test_otlp_json.py keeps them alike)."""
    try:
        if json:
            if body.count(b"{") >= COLUMNS_FROM_OBJECTS and (lines := otlp_columns.json_body(body, received_ns, max_events)) is not None:
                return lines
            try:
                document = orjson.loads(body)
            except orjson.JSONDecodeError as exc:
                raise OtlpError(f"the body is not JSON: {exc}") from None
            if isinstance(document, dict) and (direct := otel.json_events(document, received_ns)) is not None:
                return direct
        request, refused[:] = otel.parse_request(body, json)
        if not refused and otel.record_count(request) >= COLUMNS_FROM_RECORDS:
            if (lines := otlp_columns.protobuf_body(request, received_ns, max_events, None if json else body)) is not None:
                return lines
        events = list(otel.events(request, received_ns, refused))
    except OtlpError as exc:
        raise BadRequestBody(str(exc)) from None
    if refused and not events:
        raise BadRequestBody(f"no log record of the export could be read: {_listed(refused)}")
    return events


def _listed(refused: list[str]) -> str:
    shown = "; ".join(refused[:3])
    return shown + (f"; and {len(refused) - 3} more" if len(refused) > 3 else "")
