"""Body decoding and parsing, without Redis or Spark."""

from __future__ import annotations

import gzip
import tracemalloc

import orjson
import pytest

from service.exceptions import BadRequestBody, BodyTooLarge
from service.ingest import decode_body, gunzip_bounded, parse_events


def test_ndjson_keeps_one_object_per_line_and_skips_blank_lines() -> None:
    parsed = parse_events(b'{"a":1}\n\n{"a":2}\r\n', "application/x-ndjson", 10)
    assert parsed.events == 2
    assert [orjson.loads(line) for line in parsed.ndjson.split(b"\n")] == [{"a": 1}, {"a": 2}]


def test_json_array_and_object() -> None:
    assert parse_events(b'[{"a":1},{"b":2}]', "application/json", 10).events == 2
    assert parse_events(b'{"a":1}', "application/json; charset=utf-8", 10).events == 1


def test_malformed_ndjson_names_the_line() -> None:
    with pytest.raises(BadRequestBody, match="line 3"):
        parse_events(b'{"a":1}\n{"a":2}\n{"a":\n', "application/x-ndjson", 10)


def test_non_object_events_are_refused() -> None:
    with pytest.raises(BadRequestBody, match="element 1"):
        parse_events(b'[{"a":1}, 2]', "application/json", 10)
    with pytest.raises(BadRequestBody, match="line 1"):
        parse_events(b"[1,2]\n", "application/x-ndjson", 10)


def test_event_count_limit() -> None:
    with pytest.raises(BodyTooLarge, match="more than 2 events"):
        parse_events(b'{"a":1}\n{"a":1}\n{"a":1}', "application/x-ndjson", 2)


def test_unknown_encoding_and_content_type() -> None:
    with pytest.raises(BadRequestBody, match="Content-Encoding"):
        decode_body(b"x", "br", 100)
    with pytest.raises(BadRequestBody, match="Content-Type"):
        parse_events(b"x", "text/csv", 10)


def test_gzip_round_trip_and_truncation() -> None:
    body = b'{"a":1}\n' * 100
    assert decode_body(gzip.compress(body), "gzip", 10_000) == body
    with pytest.raises(BadRequestBody, match="truncated"):
        gunzip_bounded(gzip.compress(body)[:-12], 10_000)


def test_gzip_bomb_is_refused_with_bounded_memory() -> None:
    bomb = gzip.compress(b"\0" * (200 * 1024 * 1024))  # 200 MiB of zeros, ~200 KiB compressed
    limit = 1024 * 1024
    tracemalloc.start()
    with pytest.raises(BodyTooLarge, match="decompressed body exceeds"):
        gunzip_bounded(bomb, limit)
    _current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 8 * limit, f"decompression peaked at {peak} bytes"
