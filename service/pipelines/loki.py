"""The built-in `loki_logs` pipeline: Loki push requests as events of one declared schema.

`POST /loki/api/v1/push` (service/api/routes/loki.py) takes what Promtail, Grafana Alloy, Vector's
and Fluent Bit's `loki` outputs and Loki client libraries send: JSON
(`{"streams": [{"stream": {labels}, "values": [["<ns>", "<line>", {metadata}?], ...]}]}`), or a
snappy-compressed protobuf `logproto.PushRequest`. Each log line becomes one event: its time, the
line, the stream's labels and the line's structured metadata as maps of strings.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import cramjam
import orjson
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2
from google.protobuf.message import DecodeError

from service.core.exceptions import BodyTooLarge, LokiError
from service.pipelines.timestamps import iso_from_unix_nanos

LOKI_LOGS_SCHEMA = {
    "columns": [
        {"name": "timestamp", "type": "timestamptz", "required": True},
        {"name": "line", "type": "string"},
        {"name": "labels", "type": "map<string, string>"},
        {"name": "structured_metadata", "type": "map<string, string>"},
    ],
    "partition_spec": [{"column": "timestamp", "transform": "day"}],
}
# A Prometheus label set as Loki's protobuf carries it: {job="api", level="error"}.
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_.]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_ESCAPES = re.compile(r"\\(.)")


def _push_request_class() -> type:
    """Loki's `logproto.PushRequest` (grafana/loki pkg/push/push.proto), declared field by field:
    no Python package ships Loki's generated classes, and protobuf parses by this description."""
    string, uint64, message = (descriptor_pb2.FieldDescriptorProto.TYPE_STRING, descriptor_pb2.FieldDescriptorProto.TYPE_UINT64,
                               descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE)
    optional, repeated = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL, descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
    proto = descriptor_pb2.FileDescriptorProto(name="calve/loki_push.proto", package="logproto", syntax="proto3",
                                               dependency=["google/protobuf/timestamp.proto"])
    for name, fields in (
        ("PushRequest", [("streams", 1, message, repeated, ".logproto.StreamAdapter")]),
        ("StreamAdapter", [("labels", 1, string, optional, None), ("entries", 2, message, repeated, ".logproto.EntryAdapter"),
                           ("hash", 3, uint64, optional, None)]),
        ("LabelPairAdapter", [("name", 1, string, optional, None), ("value", 2, string, optional, None)]),
        ("EntryAdapter", [("timestamp", 1, message, optional, ".google.protobuf.Timestamp"), ("line", 2, string, optional, None),
                          ("structuredMetadata", 3, message, repeated, ".logproto.LabelPairAdapter")]),
    ):
        declared = proto.message_type.add(name=name)
        for field_name, number, kind, label, type_name in fields:
            declared.field.add(name=field_name, number=number, type=kind, label=label, **({"type_name": type_name} if type_name else {}))
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("logproto.PushRequest"))


PushRequest = _push_request_class()


def events(body: bytes, protobuf: bool, max_bytes: int) -> Iterator[dict]:
    """One event per log line of a push request (protobuf: snappy-compressed, as Loki takes it)."""
    return _from_protobuf(_unsnappy(body, max_bytes)) if protobuf else _from_json(body)


def _unsnappy(body: bytes, max_bytes: int) -> bytes:
    try:
        size = cramjam.snappy.decompress_raw_len(body)
        if size > max_bytes:
            raise BodyTooLarge(f"the push request decompresses to {size} bytes, over the limit of {max_bytes}; send smaller batches")
        return bytes(cramjam.snappy.decompress_raw(body))
    except cramjam.DecompressionError as exc:
        raise LokiError(f"a protobuf push request is snappy-compressed (block format); this body is not ({exc})") from None


def _from_protobuf(data: bytes) -> Iterator[dict]:
    request = PushRequest()
    try:
        request.ParseFromString(data)
    except DecodeError as exc:
        raise LokiError(f"the body is not a Loki PushRequest in protobuf ({exc})") from None
    for stream in request.streams:
        labels = parse_labels(stream.labels)
        for entry in stream.entries:
            nanos = entry.timestamp.seconds * 1_000_000_000 + entry.timestamp.nanos
            yield _event(nanos, entry.line, labels, {pair.name: pair.value for pair in entry.structuredMetadata})


def _from_json(body: bytes) -> Iterator[dict]:
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise LokiError(f"the body is not JSON: {exc}") from None
    streams = document.get("streams") if isinstance(document, dict) else None
    if not isinstance(streams, list):
        raise LokiError('a push request is {"streams": [{"stream": {labels}, "values": [["<unix ns>", "<line>"], ...]}]}')
    for index, stream in enumerate(streams):
        labels = stream.get("stream") if isinstance(stream, dict) else None
        values = stream.get("values") if isinstance(stream, dict) else None
        if not isinstance(labels, dict) or not isinstance(values, list):
            raise LokiError(f"streams[{index}] needs a stream (its labels, an object) and values (a list)")
        if not _strings(labels):
            raise LokiError(f"streams[{index}].stream: label values are strings")
        for position, value in enumerate(values):
            if not isinstance(value, list) or len(value) not in (2, 3) or not isinstance(value[1], str):
                raise LokiError(f'streams[{index}].values[{position}] is ["<unix ns>", "<line>"] or ["<unix ns>", "<line>", {{metadata}}]')
            if not (isinstance(value[0], str) and value[0].isascii() and value[0].isdigit() and len(value[0]) <= 19):
                raise LokiError(f"streams[{index}].values[{position}]: the time is nanoseconds since 1970, as a string of digits")
            metadata = value[2] if len(value) == 3 else {}
            if not _strings(metadata):
                raise LokiError(f"streams[{index}].values[{position}]: structured metadata is an object of strings")
            yield _event(int(value[0]), value[1], labels, metadata)


def _event(nanos: int, line: str, labels: dict[str, str], metadata: dict[str, str]) -> dict:
    try:
        event: dict[str, Any] = {"timestamp": iso_from_unix_nanos(nanos), "line": line, "labels": labels}
    except ValueError as exc:
        raise LokiError(str(exc)) from None
    if metadata:
        event["structured_metadata"] = metadata
    return event


def _strings(value: Any) -> bool:
    """Whether `value` is an object of strings, as Loki's labels and structured metadata are."""
    return isinstance(value, dict) and all(isinstance(item, str) for item in value.values())


def parse_labels(text: str) -> dict[str, str]:
    """`{job="api", msg="say \\"hi\\""}` -> {"job": "api", "msg": 'say "hi"'}."""
    inner = text.strip()
    if not (inner.startswith("{") and inner.endswith("}")):
        raise LokiError(f'stream labels are written {{name="value", ...}}, not {text[:100]!r}')
    inner, labels, position = inner[1:-1], {}, 0
    while position < len(inner.rstrip()):
        match = _LABEL.match(inner, position)
        if match is None:
            raise LokiError(f"stream labels {text[:100]!r}: cannot read a name=\"value\" pair at character {position + 1}")
        labels[match.group(1)] = _ESCAPES.sub(lambda escape: {"n": "\n", "t": "\t"}.get(escape.group(1), escape.group(1)), match.group(2))
        position = match.end()
    return labels
