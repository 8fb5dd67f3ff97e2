"""Request bodies to NDJSON: decompression within limits, parsing with precise errors.

The api validates every event so that a malformed request is refused whole with the line that
failed, and what reaches Redis is always one line per event, in one of two forms:

- the event as one JSON object, re-encoded by orjson: duplicate keys at any depth keep their last
  value (as they do in a JSON array body), so no event reaches Spark with an ambiguous field;
- an event Calve will not hand to Spark, set aside for the DLQ: `!` followed by a JSON object
  `{"reason": ..., "event": <the original text>}`. No JSON object starts with `!`, so a producer
  cannot forge one. Today's only cause is nesting deeper than MAX_DEPTH: Spark Connect carries a
  batch's schema as nested protobuf messages, and a deep enough event fails the whole job
  (protobuf's decode depth limit) for every tenant sharing the writer.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass

import orjson

from service.core.exceptions import BadRequestBody, BodyTooLarge
from spark_jobs import contract

NDJSON_TYPES = frozenset({"application/x-ndjson", "application/ndjson", "application/jsonl", "application/json-lines"})
# curl -d sends application/x-www-form-urlencoded unless told otherwise; its body is still JSON.
JSON_TYPES = frozenset({"application/json", "text/json", "application/x-www-form-urlencoded", ""})
# Objects and arrays nested in one event, the event itself counting as 1 (Elasticsearch's default
# mapping depth limit is 20, but measured here a Spark Connect job converting events to a table's
# schema fails from 12 levels: pyspark's protobuf decoder refuses the nested cast expressions).
MAX_DEPTH = 8
SET_ASIDE_MARK = contract.SET_ASIDE_MARK.encode()


@dataclass(frozen=True)
class ParsedBody:
    """A request's events, one JSON object per line."""

    ndjson: bytes
    events: int
    set_aside: int = 0  # events bound for the DLQ without reaching Spark (see the module's docstring)


def gunzip_bounded(data: bytes, limit: int) -> bytes:
    """Decompress a gzip body, refusing it as soon as it would exceed `limit` bytes.

    `max_length` stops zlib from producing more than limit + 1 bytes, so a compression bomb
    costs at most that much memory.
    """
    decompressor = zlib.decompressobj(wbits=zlib.MAX_WBITS | 16)
    try:
        out = decompressor.decompress(data, limit + 1)
    except zlib.error as exc:
        raise BadRequestBody(f"body is not valid gzip ({exc}); send it uncompressed or fix the encoder") from exc
    if len(out) > limit or decompressor.unconsumed_tail:
        raise BodyTooLarge(f"decompressed body exceeds the limit of {limit} bytes; split it into smaller requests")
    if not decompressor.eof:
        raise BadRequestBody("gzip body is truncated")
    if decompressor.unused_data:
        raise BadRequestBody("body holds data after the gzip stream (multi-member gzip is not accepted)")
    return out


def decode_body(data: bytes, content_encoding: str, limit: int) -> bytes:
    encoding = content_encoding.strip().lower()
    if encoding in ("", "identity"):
        if len(data) > limit:
            raise BodyTooLarge(f"body exceeds the limit of {limit} bytes; split it into smaller requests")
        return data
    if encoding in ("gzip", "x-gzip"):
        return gunzip_bounded(data, limit)
    raise BadRequestBody(f"unsupported Content-Encoding {content_encoding!r}; use gzip or none")


def media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def parse_events(body: bytes, content_type: str, max_events: int) -> ParsedBody:
    kind = media_type(content_type)
    if kind in NDJSON_TYPES:
        return _parse_ndjson(body, max_events)
    if kind in JSON_TYPES:
        return _parse_json(body, max_events)
    raise BadRequestBody(
        f"unsupported Content-Type {kind!r}; send application/json (an object or an array of objects) "
        "or application/x-ndjson (one object per line)"
    )


def deeper_than(value: object, limit: int) -> bool:
    """Whether objects and arrays nest more than `limit` levels in `value` (iterative: any depth)."""
    pending = [(value, 1)]
    while pending:
        node, depth = pending.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        pending.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def set_aside_line(reason: str, event_text: str) -> bytes:
    return SET_ASIDE_MARK + orjson.dumps({"reason": reason, "event": event_text})


def event_line(value: dict, text: bytes | None = None) -> bytes:
    """The line the writer gets for one event object (`text`: its original JSON, when known)."""
    try:
        line = orjson.dumps(value)
    except orjson.JSONEncodeError:  # nested beyond orjson's 254 levels: too deep by far
        line = None
    if line is None or (may_be_deep(line) and deeper_than(value, MAX_DEPTH)):
        return set_aside_line(f"the event nests objects or arrays more than {MAX_DEPTH} levels deep; "
                              "flatten it or send deep parts as JSON text", _original_text(value, text))
    return line


def may_be_deep(text: bytes) -> bool:
    # Counting brackets is cheap and never under-counts nesting; only a suspect event is walked.
    return text.count(b"{") + text.count(b"[") > MAX_DEPTH


def _original_text(value: dict, text: bytes | None) -> str:
    if text is not None:
        return text.decode()
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError:  # orjson stops at 254 levels; the standard library goes deeper
        try:
            return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        except RecursionError:
            return "(the event was too deeply nested to keep its text)"


def _parse_ndjson(body: bytes, max_events: int) -> ParsedBody:
    lines: list[bytes] = []
    for number, raw in enumerate(body.split(b"\n"), start=1):
        line = raw.strip()
        if not line:
            continue
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            if str(exc).startswith("depth limit exceeded") and line.startswith(b"{"):
                event = set_aside_line(f"the event nests objects or arrays deeper than JSON parsing allows ({exc})", line.decode(errors="replace"))
            else:
                raise BadRequestBody(f"line {number}: malformed JSON ({exc}); nothing from this request was accepted") from exc
        else:
            if not isinstance(value, dict):
                raise BadRequestBody(f"line {number}: expected a JSON object, got {type(value).__name__}")
            event = event_line(value, line)
        lines.append(event)
        if len(lines) > max_events:
            raise BodyTooLarge(f"more than {max_events} events in one request; split it")
    if not lines:
        raise BadRequestBody("the body holds no events")
    return ParsedBody(ndjson=b"\n".join(lines), events=len(lines), set_aside=_set_aside(lines))


def _parse_json(body: bytes, max_events: int) -> ParsedBody:
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        hint = " (for one object per line, send Content-Type: application/x-ndjson)" if b"\n" in body.strip() else ""
        if str(exc).startswith("depth limit exceeded"):
            hint = f" (nesting deeper than {MAX_DEPTH} levels is not accepted in an event)"
        raise BadRequestBody(f"malformed JSON: {exc}{hint}") from exc
    events = [value] if isinstance(value, dict) else value
    if not isinstance(events, list):
        raise BadRequestBody(f"expected a JSON object or an array of objects, got {type(value).__name__}")
    if not events:
        raise BadRequestBody("the body holds no events")
    if len(events) > max_events:
        raise BodyTooLarge(f"more than {max_events} events in one request; split it")
    for index, event in enumerate(events):
        if not isinstance(event, dict):
            raise BadRequestBody(f"element {index}: expected a JSON object, got {type(event).__name__}")
    lines = [event_line(event) for event in events]
    return ParsedBody(ndjson=b"\n".join(lines), events=len(lines), set_aside=_set_aside(lines))


def normalize_events(lines: list[bytes]) -> ParsedBody:
    """Events stored elsewhere (the DLQ) as lines for the writer, each checked as the api checks a
    request's, so a replay cannot hand Spark what intake would not. Text that is not a JSON object
    is set aside again with the reason."""
    out = []
    for text in lines:
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            out.append(set_aside_line(f"not a JSON object ({exc})", text.decode(errors="replace")))
            continue
        if not isinstance(value, dict):
            out.append(set_aside_line(f"expected a JSON object, got {type(value).__name__}", text.decode(errors="replace")))
            continue
        out.append(event_line(value, text))
    return ParsedBody(ndjson=b"\n".join(out), events=len(out), set_aside=_set_aside(out))


def _set_aside(lines: list[bytes]) -> int:
    return sum(line.startswith(SET_ASIDE_MARK) for line in lines)
