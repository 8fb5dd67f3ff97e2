"""The built-in `otel_logs` pipeline: OpenTelemetry log records as events of one declared schema.

`POST /otlp/v1/logs` (service/api/routes/otlp.py) decodes an OTLP `ExportLogsServiceRequest`
(protobuf, or the OTLP JSON mapping) with the `opentelemetry-proto` classes; this module turns each
LogRecord into one event, flat enough for any engine: attributes become maps of strings (a value
that is not a string is kept as its JSON text), the body is text (JSON text unless it is a string),
ids are lower-case hex, times ISO 8601 in UTC with microseconds.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator
from typing import Any

import orjson
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from service.core.exceptions import OtlpError
from service.pipelines.timestamps import iso_from_unix_nanos

OTEL_LOGS_SCHEMA = {
    "columns": [
        {"name": "timestamp", "type": "timestamptz", "required": True},
        {"name": "observed_timestamp", "type": "timestamptz"},
        {"name": "severity_number", "type": "int"},
        {"name": "severity_text", "type": "string"},
        {"name": "body", "type": "string"},
        {"name": "attributes", "type": "map<string, string>"},
        {"name": "resource_attributes", "type": "map<string, string>"},
        {"name": "scope_name", "type": "string"},
        {"name": "scope_version", "type": "string"},
        {"name": "trace_id", "type": "string"},
        {"name": "span_id", "type": "string"},
        {"name": "flags", "type": "long"},
        {"name": "event_name", "type": "string"},
    ],
    "partition_spec": [{"column": "timestamp", "transform": "day"}],
}
_ID_FIELDS = ("traceId", "spanId", "trace_id", "span_id")
_ANY_VALUE_KEYS = frozenset({
    "stringValue", "boolValue", "intValue", "doubleValue", "arrayValue", "kvlistValue", "bytesValue",
    "string_value", "bool_value", "int_value", "double_value", "array_value", "kvlist_value", "bytes_value",
})


def parse_request(body: bytes, json: bool) -> ExportLogsServiceRequest:
    """An ExportLogsServiceRequest from protobuf bytes, or from the OTLP JSON mapping (ids in hex,
    enums as integers, 64-bit integers as strings or numbers, unknown fields ignored)."""
    request = ExportLogsServiceRequest()
    if not json:
        try:
            request.ParseFromString(body)
        except (DecodeError, RecursionError) as exc:
            raise OtlpError(f"the body is not an OTLP ExportLogsServiceRequest in protobuf ({exc})") from None
        return request
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise OtlpError(f"the body is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise OtlpError("the body is not an OTLP ExportLogsServiceRequest: a JSON object with resourceLogs")
    for record in _records(document):
        _hex_ids_to_base64(record)
        _body_as_any_value(record)
    try:
        json_format.ParseDict(document, request, ignore_unknown_fields=True)
    except (json_format.ParseError, RecursionError) as exc:
        raise OtlpError(f"the body is not an OTLP ExportLogsServiceRequest in JSON ({exc})") from None
    return request


def _records(document: dict) -> Iterator[dict]:
    """The log records of an OTLP/JSON document, as objects."""
    for resource_logs in _objects(document.get("resourceLogs", document.get("resource_logs"))):
        for scope_logs in _objects(resource_logs.get("scopeLogs", resource_logs.get("scope_logs"))):
            yield from _objects(scope_logs.get("logRecords", scope_logs.get("log_records")))


def _body_as_any_value(record: dict) -> None:
    """A record's body as an AnyValue, as protobuf's JSON mapping reads it. Hand-written senders
    put the value itself there ("body": "text"): kept as that value (numbers and booleans as
    theirs, anything else as its JSON text), never as an empty AnyValue, which would read as no
    value at all. An empty object is no value: the row's body is NULL."""
    body = record.get("body")
    if body is None or (isinstance(body, dict) and any(key in body for key in _ANY_VALUE_KEYS)):
        return
    if isinstance(body, dict) and not body:
        del record["body"]
    elif isinstance(body, bool):
        record["body"] = {"boolValue": body}
    elif isinstance(body, int):  # orjson reads up to 2**64 - 1; intValue holds an int64
        record["body"] = {"intValue": str(body)} if -(2**63) <= body < 2**63 else {"stringValue": str(body)}
    elif isinstance(body, float):
        record["body"] = {"doubleValue": body}
    else:
        record["body"] = {"stringValue": body if isinstance(body, str) else orjson.dumps(body).decode()}


def _hex_ids_to_base64(record: dict) -> None:
    """OTLP/JSON writes trace and span ids in hex where protobuf's JSON mapping reads base64."""
    for name in _ID_FIELDS:
        value = record.get(name)
        if isinstance(value, str) and value:
            try:
                record[name] = base64.b64encode(bytes.fromhex(value)).decode()
            except ValueError:
                raise OtlpError(f"{name} {value[:64]!r} is not hex") from None


def _objects(value: Any) -> list[dict]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def events(request: ExportLogsServiceRequest, received_ns: int) -> Iterator[dict]:
    """One event per LogRecord, with its resource's and scope's facts."""
    for resource_logs in request.resource_logs:
        resource = _attributes(resource_logs.resource.attributes)
        for scope_logs in resource_logs.scope_logs:
            scope = scope_logs.scope
            for record in scope_logs.log_records:
                # A record without a time takes the time it was observed, else when Calve got it.
                observed = record.observed_time_unix_nano or None
                event = {
                    "timestamp": _iso(record.time_unix_nano or observed or received_ns),
                    "observed_timestamp": _iso(observed) if observed else None,
                    "severity_number": record.severity_number or None,
                    "severity_text": record.severity_text or None,
                    # An AnyValue holding nothing is no body (NULL), never the text "null".
                    "body": _text(record.body) if record.body.WhichOneof("value") is not None else None,
                    "attributes": _attributes(record.attributes),
                    "resource_attributes": resource,
                    "scope_name": scope.name or None,
                    "scope_version": scope.version or None,
                    "trace_id": record.trace_id.hex() or None,
                    "span_id": record.span_id.hex() or None,
                    "flags": record.flags or None,
                    "event_name": record.event_name or None,
                }
                yield {key: value for key, value in event.items() if value is not None}


def _iso(unix_nano: int) -> str:
    try:
        return iso_from_unix_nanos(unix_nano)
    except ValueError as exc:
        raise OtlpError(str(exc)) from None


def _attributes(pairs: list[KeyValue]) -> dict[str, str]:
    return {pair.key: _text(pair.value) for pair in pairs}


def _text(value: AnyValue) -> str:
    plain = _plain(value)
    return plain if isinstance(plain, str) else orjson.dumps(plain).decode()


def _plain(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "kvlist_value":
        return {pair.key: _plain(pair.value) for pair in value.kvlist_value.values}
    if kind == "array_value":
        return [_plain(item) for item in value.array_value.values]
    if kind == "bytes_value":
        return binascii.b2a_base64(value.bytes_value, newline=False).decode()
    return getattr(value, kind)
