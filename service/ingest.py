"""Request bodies to NDJSON: decompression within limits, parsing with precise errors.

The api validates every event so that a malformed request is refused whole with the line that
failed, and what reaches Redis is always one JSON object per line.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import orjson

from service.exceptions import BadRequestBody, BodyTooLarge

NDJSON_TYPES = frozenset({"application/x-ndjson", "application/ndjson", "application/jsonl", "application/json-lines"})
# curl -d sends application/x-www-form-urlencoded unless told otherwise; its body is still JSON.
JSON_TYPES = frozenset({"application/json", "text/json", "application/x-www-form-urlencoded", ""})


@dataclass(frozen=True)
class ParsedBody:
    """A request's events, one JSON object per line."""

    ndjson: bytes
    events: int


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


def _parse_ndjson(body: bytes, max_events: int) -> ParsedBody:
    lines: list[bytes] = []
    for number, raw in enumerate(body.split(b"\n"), start=1):
        line = raw.strip()
        if not line:
            continue
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise BadRequestBody(f"line {number}: malformed JSON ({exc}); nothing from this request was accepted") from exc
        if not isinstance(value, dict):
            raise BadRequestBody(f"line {number}: expected a JSON object, got {type(value).__name__}")
        lines.append(line)
        if len(lines) > max_events:
            raise BodyTooLarge(f"more than {max_events} events in one request; split it")
    if not lines:
        raise BadRequestBody("the body holds no events")
    return ParsedBody(ndjson=b"\n".join(lines), events=len(lines))


def _parse_json(body: bytes, max_events: int) -> ParsedBody:
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        hint = " (for one object per line, send Content-Type: application/x-ndjson)" if b"\n" in body.strip() else ""
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
    return ParsedBody(ndjson=b"\n".join(orjson.dumps(event) for event in events), events=len(events))
