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
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord

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


def parse_request(body: bytes, json: bool) -> tuple[ExportLogsServiceRequest, list[str]]:
    """An ExportLogsServiceRequest from protobuf bytes, or from the OTLP JSON mapping (ids in hex,
    enums as integers, 64-bit integers as strings or numbers, unknown fields ignored), and why each
    log record it could not hold was refused. One bad record (an AnyValue nested past protobuf's
    depth limit, a string that is not UTF-8, an id that is not hex) is left out and named; the
    others are kept, for an exporter treats a 400 as final and would drop them all."""
    if not json:
        request = ExportLogsServiceRequest()
        try:
            request.ParseFromString(body)
        except (DecodeError, RecursionError):
            return _parse_protobuf_by_record(body)
        return request, []
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise OtlpError(f"the body is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise OtlpError("the body is not an OTLP ExportLogsServiceRequest: a JSON object with resourceLogs")
    request = ExportLogsServiceRequest()
    try:
        for record in _records(document):
            _hex_ids_to_base64(record)
            _body_as_any_value(record)
        json_format.ParseDict(document, request, ignore_unknown_fields=True)
    except (OtlpError, json_format.ParseError, RecursionError):
        return _parse_json_by_record(orjson.loads(body))  # afresh: the records above were changed in place
    return request, []


def _parse_json_by_record(document: dict) -> tuple[ExportLogsServiceRequest, list[str]]:
    request, refused, position = ExportLogsServiceRequest(), [], -1  # position: the record's place in the export
    for resource_logs in _objects(document.get("resourceLogs", document.get("resource_logs"))):
        into = request.resource_logs.add()
        _parse_dict({key: value for key, value in resource_logs.items() if key not in ("scopeLogs", "scope_logs")}, into, "resourceLogs")
        for scope_logs in _objects(resource_logs.get("scopeLogs", resource_logs.get("scope_logs"))):
            scope_into = into.scope_logs.add()
            _parse_dict({key: value for key, value in scope_logs.items() if key not in ("logRecords", "log_records")}, scope_into, "scopeLogs")
            for record in _objects(scope_logs.get("logRecords", scope_logs.get("log_records"))):
                position += 1
                try:
                    _hex_ids_to_base64(record)
                    _body_as_any_value(record)
                    parsed = json_format.ParseDict(record, LogRecord(), ignore_unknown_fields=True)
                except (OtlpError, json_format.ParseError, RecursionError) as exc:
                    refused.append(f"log record {position}: {_said(exc)}")
                    continue
                scope_into.log_records.append(parsed)
    return request, refused


def _parse_dict(value: dict, into: Message, what: str) -> None:
    try:
        json_format.ParseDict(value, into, ignore_unknown_fields=True)
    except (json_format.ParseError, RecursionError) as exc:
        raise OtlpError(f"the body is not an OTLP ExportLogsServiceRequest in JSON: a {what} is not one ({_said(exc)})") from None


def _parse_protobuf_by_record(body: bytes) -> tuple[ExportLogsServiceRequest, list[str]]:
    """The export read one log record at a time from protobuf's wire format, after the whole
    message failed to parse: the records that parse are kept, the others named."""
    request, refused, position = ExportLogsServiceRequest(), [], -1  # position: the record's place in the export
    try:
        for number, resource_logs in _wire_fields(body):
            if number != _RESOURCE_LOGS:
                continue
            into = request.resource_logs.add()
            into.MergeFromString(b"".join(raw for n, raw in _wire_fields(resource_logs, raw=True) if n != _SCOPE_LOGS))
            for number_in, scope_logs in _wire_fields(resource_logs):
                if number_in != _SCOPE_LOGS:
                    continue
                scope_into = into.scope_logs.add()
                scope_into.MergeFromString(b"".join(raw for n, raw in _wire_fields(scope_logs, raw=True) if n != _LOG_RECORDS))
                for number_record, record in _wire_fields(scope_logs):
                    if number_record != _LOG_RECORDS:
                        continue
                    position += 1
                    try:
                        scope_into.log_records.append(LogRecord.FromString(record))
                    except (DecodeError, RecursionError) as exc:
                        refused.append(f"log record {position}: {_said(exc)}")
    except (DecodeError, RecursionError, ValueError) as exc:
        raise OtlpError(f"the body is not an OTLP ExportLogsServiceRequest in protobuf ({_said(exc)})") from None
    return request, refused


# Field numbers of opentelemetry-proto's logs messages: ExportLogsServiceRequest.resource_logs,
# ResourceLogs.scope_logs, ScopeLogs.log_records.
_RESOURCE_LOGS, _SCOPE_LOGS, _LOG_RECORDS = 1, 2, 2


def _wire_fields(data: bytes, raw: bool = False) -> Iterator[tuple[int, bytes]]:
    """The fields of a protobuf message as (number, payload of a length-delimited field, or the
    field's whole encoding with `raw`); other wire types are skipped (or given whole with `raw`)."""
    position = 0
    while position < len(data):
        start = position
        key, position = _varint(data, position)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            _value, position = _varint(data, position)
            payload = b""
        elif wire_type in (1, 5):
            position += 8 if wire_type == 1 else 4
            payload = b""
        elif wire_type == 2:
            length, position = _varint(data, position)
            payload, position = data[position:position + length], position + length
        else:
            raise DecodeError(f"wire type {wire_type} of field {number} is not one these messages use")
        if position > len(data):
            raise DecodeError("the message is truncated")
        if raw:
            yield number, data[start:position]
        elif wire_type == 2:
            yield number, payload


def _varint(data: bytes, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if position >= len(data) or shift > 63:
            raise DecodeError("a varint is truncated or too long")
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, position


def _said(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, RecursionError) or "MaxDepth" in text or "too deep" in text:
        return "its values nest deeper than protobuf's limit of 100 messages"
    if "UTF-8" in text:
        return "a string in it is not valid UTF-8"
    return text[:300]


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


def record_count(request: ExportLogsServiceRequest) -> int:
    return sum(len(scope_logs.log_records) for resource_logs in request.resource_logs for scope_logs in resource_logs.scope_logs)


def events(request: ExportLogsServiceRequest, received_ns: int, refused: list[str]) -> Iterator[dict]:
    """One event per LogRecord, with its resource's and scope's facts; a record whose times are
    out of range is left out, and why is added to `refused`."""
    position = -1
    for resource_logs in request.resource_logs:
        resource = _attributes(resource_logs.resource.attributes)
        for scope_logs in resource_logs.scope_logs:
            scope = scope_logs.scope
            for record in scope_logs.log_records:
                position += 1
                # A record without a time takes the time it was observed, else when Calve got it.
                observed = record.observed_time_unix_nano or None
                try:
                    times = _iso(record.time_unix_nano or observed or received_ns), _iso(observed) if observed else None
                except OtlpError as exc:
                    refused.append(f"log record {position} of those decoded: {exc}")
                    continue
                event = {
                    "timestamp": times[0],
                    "observed_timestamp": times[1],
                    "severity_number": record.severity_number or None,
                    "severity_text": record.severity_text or None,
                    "body": body_text(record.body),
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


class _NotPlain(Exception):
    """Something in an OTLP/JSON export that the direct reading (json_events) leaves to protobuf's."""


_RECORD_KEYS = frozenset({"timeUnixNano", "observedTimeUnixNano", "severityNumber", "severityText", "body", "attributes",
                          "droppedAttributesCount", "flags", "traceId", "spanId", "eventName"})
_HEX = frozenset("0123456789abcdefABCDEF")
_KEY_VALUE = frozenset({"key", "value"})
_DIGITS = frozenset("0123456789")


def json_events(document: dict, received_ns: int) -> list[dict] | None:
    """The events of an OTLP/JSON export read straight from its JSON, as `events(parse_request(...))`
    reads them, for exports written as OTLP's JSON encoding spells them (what SDKs and Collectors
    send): camelCase names, int64s as strings or integers, enums as integers, ids in hex, string,
    integer, double and boolean attribute values, string bodies. None for anything else (another
    spelling, another kind of value, a field these messages do not have, a time out of range):
    then protobuf's JSON mapping reads the export, which decides what each record becomes. About
    a twentieth of the CPU of building protobuf messages from the JSON first."""
    try:
        out: list[dict] = []
        for resource_logs in _list(_only(document, ("resourceLogs",)).get("resourceLogs")):
            _only(resource_logs, ("resource", "scopeLogs", "schemaUrl"))
            _text_or_none(resource_logs.get("schemaUrl"))
            resource = _only(resource_logs.get("resource", {}), ("attributes", "droppedAttributesCount"))
            _uint(resource.get("droppedAttributesCount", 0), 32)
            resource_attributes = _json_attributes(resource.get("attributes"))
            for scope_logs in _list(resource_logs.get("scopeLogs")):
                _only(scope_logs, ("scope", "logRecords", "schemaUrl"))
                _text_or_none(scope_logs.get("schemaUrl"))
                scope = _only(scope_logs.get("scope", {}), ("name", "version", "attributes", "droppedAttributesCount"))
                _uint(scope.get("droppedAttributesCount", 0), 32)
                _json_attributes(scope.get("attributes"))
                scope_name, scope_version = _text_or_none(scope.get("name")), _text_or_none(scope.get("version"))
                for record in _list(scope_logs.get("logRecords")):
                    out.append(_json_event(record, received_ns, resource_attributes, scope_name, scope_version))
        return out
    except _NotPlain:
        return None


def _json_event(record: dict, received_ns: int, resource: dict, scope_name: str | None, scope_version: str | None) -> dict:
    if type(record) is not dict or not _RECORD_KEYS.issuperset(record):
        raise _NotPlain
    get = record.get
    if "droppedAttributesCount" in record:
        _uint(record["droppedAttributesCount"], 32)
    observed = _uint(get("observedTimeUnixNano", 0), 64)
    severity = get("severityNumber", 0)
    if type(severity) is not int or not 0 <= severity <= 24:
        raise _NotPlain
    body = get("body")
    if type(body) is dict:
        body = _any_value_text(body) if body else None  # an empty AnyValue is no body
    elif body is not None and type(body) is not str:
        raise _NotPlain  # a bare value other than a string: _body_as_any_value and protobuf say what it becomes
    try:
        event = {"timestamp": iso_from_unix_nanos(_uint(get("timeUnixNano", 0), 64) or observed or received_ns)}
        if observed:
            event["observed_timestamp"] = iso_from_unix_nanos(observed)
    except ValueError:
        raise _NotPlain from None
    # In events()'s order, each left out where it is None there.
    if severity:
        event["severity_number"] = severity
    if text := _text_or_none(get("severityText")):
        event["severity_text"] = text
    if body is not None:
        event["body"] = body
    event["attributes"] = _json_attributes(get("attributes"))
    event["resource_attributes"] = resource
    if scope_name is not None:
        event["scope_name"] = scope_name
    if scope_version is not None:
        event["scope_version"] = scope_version
    if trace_id := _hex_id(get("traceId")):
        event["trace_id"] = trace_id
    if span_id := _hex_id(get("spanId")):
        event["span_id"] = span_id
    if flags := _uint(get("flags", 0), 32):
        event["flags"] = flags
    if name := _text_or_none(get("eventName")):
        event["event_name"] = name
    return event


def _only(value: Any, names: tuple[str, ...]) -> dict:
    if not isinstance(value, dict) or any(key not in names for key in value):
        raise _NotPlain
    return value


def _list(value: Any) -> list:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _NotPlain
    return value


def _text_or_none(value: Any) -> str | None:
    if type(value) is str:
        return value or None
    if value is None:
        return None
    raise _NotPlain


def _uint(value: Any, bits: int) -> int:
    """An unsigned integer field as JSON carries it: an integer, or its decimal digits in a string."""
    if type(value) is int and 0 <= value < 1 << bits:
        return value
    if isinstance(value, str) and value and len(value) <= 20 and _DIGITS.issuperset(value):
        value = int(value)
    if type(value) is not int or not 0 <= value < 1 << bits:
        raise _NotPlain
    return value


def _hex_id(value: Any) -> str | None:
    if not value and (value is None or value == ""):
        return None
    if type(value) is not str or len(value) % 2 or not _HEX.issuperset(value):
        raise _NotPlain
    return value.lower()


def _json_attributes(pairs: Any) -> dict[str, str]:
    """KeyValues as `_attributes` makes them of protobuf's reading: each value's text."""
    attributes = {}
    for pair in _list(pairs):
        if type(pair) is not dict or type(key := pair.get("key")) is not str or not _KEY_VALUE.issuperset(pair):
            raise _NotPlain
        value = pair.get("value")
        if type(value) is dict and len(value) == 1 and type(text := value.get("stringValue")) is str:
            attributes[key] = text  # the commonest kind, first
        elif value is None or value == {}:
            attributes[key] = "null"  # an AnyValue holding nothing, as value_text writes it
        else:
            attributes[key] = _any_value_text(value)
    return attributes


def _any_value_text(value: Any) -> str:
    """The text `value_text` gives an AnyValue of one scalar kind, read from its JSON."""
    if not isinstance(value, dict) or len(value) != 1:
        raise _NotPlain
    ((kind, item),) = value.items()
    if kind == "stringValue" and isinstance(item, str):
        return item
    if kind == "boolValue" and isinstance(item, bool):
        return "true" if item else "false"
    if kind == "intValue":
        if isinstance(item, str) and item not in ("", "-") and len(item) <= 20 and _DIGITS.issuperset(item.removeprefix("-")):
            item = int(item)
        if type(item) is int and -(1 << 63) <= item < 1 << 63:
            return str(item)
    if kind == "doubleValue" and type(item) in (int, float):
        return orjson.dumps(float(item)).decode()
    raise _NotPlain


def _iso(unix_nano: int) -> str:
    try:
        return iso_from_unix_nanos(unix_nano)
    except ValueError as exc:
        raise OtlpError(str(exc)) from None


def _attributes(pairs: list[KeyValue]) -> dict[str, str]:
    return {pair.key: value_text(pair.value) for pair in pairs}


def body_text(body: AnyValue) -> str | None:
    """A record's body as its text: an AnyValue holding nothing is no body (NULL), never the text "null"."""
    return value_text(body) if body.WhichOneof("value") is not None else None


def value_text(value: AnyValue) -> str:
    """An attribute's or a body's value as text: a string itself, anything else its JSON text."""
    kind = value.WhichOneof("value")
    if kind == "string_value":  # the commonest kinds first, as the general way below spells them
        return value.string_value
    if kind == "int_value":
        return str(value.int_value)
    if kind == "bool_value":
        return "true" if value.bool_value else "false"
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
