"""The built-in `loki_logs` pipeline: Loki push requests as events of one declared schema.

`POST /loki/api/v1/push` (service/api/routes/loki.py) takes what Promtail, Grafana Alloy, Vector's
and Fluent Bit's `loki` outputs and Loki client libraries send: JSON
(`{"streams": [{"stream": {labels}, "values": [["<ns>", "<line>", {metadata}?], ...]}]}`), or a
snappy-compressed protobuf `logproto.PushRequest`. Each log line becomes one event: its time, the
line, the stream's labels and the line's structured metadata as maps of strings.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
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
NO_METADATA: dict[str, str] = {}  # a line's without any (shared: never changed)


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


def entries(body: bytes, protobuf: bool, max_bytes: int) -> Iterator[tuple[int, str, dict[str, str], dict[str, str]]]:
    """(nanoseconds, line, labels, structured metadata) per log line of a push request (protobuf:
    snappy-compressed, as Loki takes it); a stream's lines share its one labels object. `event`
    makes one an event."""
    return _from_protobuf(_unsnappy(body, max_bytes)) if protobuf else _from_json(body)


def event_texts(body: bytes, protobuf: bool, max_bytes: int, plain: Callable[[str], bool]) -> Iterator[bytes | dict]:
    """Each log line's event as the JSON text `orjson.dumps` gives of `event`'s dict, put together
    from its parts: a stream's labels are encoded once, not once per line (a push's lines share a
    few streams). The event itself (a dict) where labels or metadata have a key `plain` refuses:
    the caller checks those as it checks any event."""
    last_labels, labels_text = None, None
    for nanos, line, labels, metadata in entries(body, protobuf, max_bytes):
        if labels is not last_labels:  # a stream's lines come one after another
            last_labels, labels_text = labels, orjson.dumps(labels) if all(map(plain, labels)) else None
        if labels_text is None or metadata and not all(map(plain, metadata)):
            yield event(nanos, line, labels, metadata)
            continue
        try:
            stamp = iso_from_unix_nanos(nanos)
        except ValueError as exc:
            raise LokiError(str(exc)) from None
        text = b'{"timestamp":"' + stamp.encode() + b'","line":' + orjson.dumps(line) + b',"labels":' + labels_text
        yield text + b',"structured_metadata":' + orjson.dumps(metadata) + b"}" if metadata else text + b"}"


def _unsnappy(body: bytes, max_bytes: int) -> bytes:
    try:
        size = cramjam.snappy.decompress_raw_len(body)
        if size > max_bytes:
            raise BodyTooLarge(f"the push request decompresses to {size} bytes, over the limit of {max_bytes}; send smaller batches")
        return bytes(cramjam.snappy.decompress_raw(body))
    except cramjam.DecompressionError as exc:
        raise LokiError(f"a protobuf push request is snappy-compressed (block format); this body is not ({exc})") from None


def _from_protobuf(data: bytes) -> Iterator[tuple[int, str, dict[str, str], dict[str, str]]]:
    request = PushRequest()
    try:
        request.ParseFromString(data)
    except DecodeError as exc:
        raise LokiError(f"the body is not a Loki PushRequest in protobuf ({exc})") from None
    for stream in request.streams:
        labels = parse_labels(stream.labels)
        for entry in stream.entries:
            nanos = entry.timestamp.seconds * 1_000_000_000 + entry.timestamp.nanos
            yield nanos, entry.line, labels, {pair.name: pair.value for pair in entry.structuredMetadata}


def _from_json(body: bytes) -> Iterator[tuple[int, str, dict[str, str], dict[str, str]]]:
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
            if type(value) is not list or not 2 <= len(value) <= 3 or type(value[1]) is not str:
                raise LokiError(f'streams[{index}].values[{position}] is ["<unix ns>", "<line>"] or ["<unix ns>", "<line>", {{metadata}}]')
            nanos = value[0]
            if not (type(nanos) is str and nanos.isascii() and nanos.isdigit() and len(nanos) <= 19):
                raise LokiError(f"streams[{index}].values[{position}]: the time is nanoseconds since 1970, as a string of digits")
            if len(value) == 2:
                yield int(nanos), value[1], labels, NO_METADATA
                continue
            if not _strings(value[2]):
                raise LokiError(f"streams[{index}].values[{position}]: structured metadata is an object of strings")
            yield int(nanos), value[1], labels, value[2]


def event(nanos: int, line: str, labels: dict[str, str], metadata: dict[str, str]) -> dict:
    """One log line as an event of the loki_logs pipeline."""
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
