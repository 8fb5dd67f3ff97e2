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
import re
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import msgspec
import numpy as np
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
# A field's name becomes a column's, and Spark's JSON parser refuses names past 50,000 characters
# (failing the whole event): a longer name is no column name. Such a field is set aside on its own
# and the event's other fields are written.
MAX_FIELD_NAME = 1024
# A part of an NDJSON body's events in one call (objects only: anything else is a ValidationError).
_OBJECTS = msgspec.json.Decoder(dict)
_FIRST_TOGETHER, _TOGETHER = 16, 64  # events read in one call: the first part, the largest (_kept_together)
# Fields an event may have for its body to be read together: msgspec makes a wide object's many
# keys dearer than orjson does (52 short fields: 4.6-4.8 against 4.1-4.3 ms per 1,000 events).
_TOGETHER_FIELDS = 32


def _table(kept: bytes, to: bytes) -> bytes:
    """A bytes.translate table: each byte of `kept` to the byte of `to` at its place, any other to 'a'."""
    table = bytearray(b"a" * 256)
    for byte, into in zip(kept, to):
        table[byte] = into
    return bytes(table)


# orjson reads an integer beyond 64 bits (above 2**64 - 1, below -2**63) as a float, losing digits.
# Such a number has 20 digits or more, or a minus and 19 (nanosecond epochs, 19 digits, do not).
# A body is looked at once for such a run, by a translate and a substring search, which run at
# memory speed (~0.15 ms per 1,000 small events; a regular expression took 2 ms): only when one is
# found is each event's text looked at, and only those that have one are read again.
_AS_DIGITS = _table(b"0123456789-", b"0000000000-")
_TWENTY_DIGITS, _NEGATIVE_19 = b"0" * 20, b"-" + b"0" * 19


def may_hold_long_integers(text: bytes) -> bool:
    """Whether `text` may hold an integer orjson cannot keep (then it is read again exactly)."""
    digits = text.translate(_AS_DIGITS)
    return _TWENTY_DIGITS in digits or _NEGATIVE_19 in digits


# A number orjson's reading does not keep: an integer beyond 64 bits (above), or one of more
# significant digits than a double keeps (16 or more: 1234567890123456.123456 became
# 1234567890123456.0, and a decimal column got that). Either is a run of at least 17 digits and
# points, looked for as above, at memory speed; a run inside a string (an IP address, a version)
# only makes its event read again.
_AS_NUMERALS = _table(b"0123456789.", b"00000000000")
_SEVENTEEN_NUMERALS = b"0" * 17


def may_hold_long_numbers(text: bytes) -> bool:
    """Whether `text` may hold a number orjson's reading changes (exact_event then reads it)."""
    return _SEVENTEEN_NUMERALS in text.translate(_AS_NUMERALS)


def _exact_integer(text: str) -> int | orjson.Fragment:
    return int(text) if len(text) < 19 else orjson.Fragment(text)


def _without_digits(text: bytes) -> bytes:
    return text.translate(None, b"0123456789")


def _respelled_numbers(value: object, text: bytes) -> bool:
    """Whether `value`'s encoding differs from `text` (the JSON it was read from) only in digits."""
    line = _encoding(value)
    return line is not None and line != text and _without_digits(line) == _without_digits(text)


# Built once: json.loads builds a decoder per call when given hooks (twice exact_event's cost).
_EXACT = json.JSONDecoder(parse_float=orjson.Fragment)
_EXACT_INTEGERS = json.JSONDecoder(parse_float=orjson.Fragment, parse_int=_exact_integer)


def exact_event(text: bytes) -> object:
    """The JSON `text` as read with each number of a fraction or an exponent, and each integer of 19
    digits or more, kept as it is spelled (orjson.Fragment: orjson writes it back as it came).
    orjson read the text first, so it is valid UTF-8 JSON without infinities or lone surrogates,
    which the standard library would let through."""
    return (_EXACT_INTEGERS if may_hold_long_integers(text) else _EXACT).decode(text.decode())


# orjson keeps integers from -2**63 to 2**64 - 1; one beyond it is a float at least this large.
_LONG_AS_FLOAT = 2.0**63


def holds_long_float(value: object) -> bool:
    """Whether `value` (orjson's reading of an event) holds a float as large as an integer orjson
    could not keep becomes: only then can its text hold one. A run of 20 digits inside a string
    (an ICCID, an order number, a hex id of small value) alone is no such integer."""
    pending = [value]
    while pending:
        node = pending.pop()
        for child in node.values() if type(node) is dict else node:
            kind = type(child)
            if kind is float:
                if not -_LONG_AS_FLOAT < child < _LONG_AS_FLOAT:
                    return True
            elif kind is dict or kind is list:
                pending.append(child)
    return False


def _objects(value: dict) -> Iterator[dict]:
    """`value` and every object in it, at any depth through objects."""
    pending = [value]
    while pending:
        node = pending.pop()
        yield node
        pending.extend(child for child in node.values() if type(child) is dict)


def _has_long_name(value: dict) -> bool:
    """Whether a field of `value`, at any depth through objects, is named longer than MAX_FIELD_NAME."""
    return any(max(map(len, node), default=0) > MAX_FIELD_NAME for node in _objects(value))


def too_many_events(max_events: int) -> BodyTooLarge:
    """The refusal (413) of a request holding more than `max_events` events, whatever its protocol."""
    return BodyTooLarge(f"more than {max_events} events in one request; split it")


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


def events_at_least(body: bytes, content_type: str) -> int:
    """The fewest events a body that is accepted holds, counted without reading it: in NDJSON, a
    line ending an object (`}` then a newline; no JSON text holds a raw newline) is an event or
    refuses the body; any other body holds one at least or is refused."""
    if media_type(content_type) not in NDJSON_TYPES:
        return 1
    return max(1, body.count(b"}\n") + body.endswith(b"}"))


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


def loads_exact(text: bytes, parsed: object) -> object:
    """`parsed` (orjson's reading of `text`), or the standard library's when `text` may hold an
    integer beyond 64 bits that orjson turned into a float. orjson read it first, so the text is
    valid JSON without infinities or lone surrogates, which the standard library would let through."""
    if not may_hold_long_integers(text) or not holds_long_float(parsed if isinstance(parsed, (dict, list)) else [parsed]):
        return parsed
    return json.loads(text)


def dumps_exact(value: dict) -> bytes | None:
    """The JSON of `value`, integers beyond 64 bits included; None when it nests too deep to encode."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:  # an integer beyond 64 bits, or nested beyond orjson's 254 levels
        pass
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=_fragment_value).encode()
    except (RecursionError, ValueError):  # too deep by far
        return None


def _fragment_value(fragment: orjson.Fragment) -> object:
    raise ValueError("a number kept as spelled (exact_event), in an event nested beyond orjson's 254 levels")


def event_lines(value: dict, text: bytes | None = None, shallow: bool = False) -> list[bytes]:
    """The lines the writer gets for one event object (`text`: its original JSON, when known):
    the event, or the event set aside; or, when some of its field names are too long to be
    columns, the event without them and those fields set aside. shallow: the caller knows the
    event cannot nest deeper than MAX_DEPTH (shallow_body)."""
    line = dumps_exact(value)
    # Only an event longer than the longest name can have one: most are never walked.
    if (line is None or len(line) > MAX_FIELD_NAME) and _has_long_name(value):
        return _split_long_names(*_without_long_names(value), text, value)
    if line is None or (not shallow and may_be_deep(line) and deeper_than(value, MAX_DEPTH)):
        return [set_aside_line(f"the event nests objects or arrays more than {MAX_DEPTH} levels deep; "
                               "flatten it or send deep parts as JSON text", _original_text(value, text))]
    return [line]


def _without_long_names(value: dict) -> tuple[dict, dict]:
    """(the event without fields named longer than MAX_FIELD_NAME at any depth through objects,
    those fields as an object of their dotted paths)."""
    long_named: dict = {}

    def keep(node: dict, path: str) -> dict:
        kept = {}
        for key, child in node.items():
            if len(key) > MAX_FIELD_NAME:
                long_named[path + key] = child
            else:
                kept[key] = keep(child, f"{path}{key}.") if isinstance(child, dict) else child
        return kept

    return keep(value, ""), long_named


def _split_long_names(kept: dict, long_named: dict, text: bytes | None, value: dict) -> list[bytes]:
    names = ", ".join(f"{name[:40]!r}... ({len(name):,} characters)" for name in long_named)
    reason = f"field names longer than {MAX_FIELD_NAME:,} characters cannot be columns: {names}"
    if not kept:
        return [set_aside_line(reason, _original_text(value, text))]
    return [*event_lines(kept), set_aside_line(f"{reason}; the event's other fields were written without them", _original_text(long_named, None))]


def shallow_body(body: bytes, events: int) -> bool:
    """Whether no event of `body` (`events` JSON objects, with whatever else it holds) can nest
    deeper than MAX_DEPTH: each event has one bracket of its own, so one has at most 1 + the
    body's brackets beyond one per event (encoded again, it has no more). Most bodies' events are
    flat: one count per body instead of one per event. Counted by numpy: bytes.count took ~0.11 ms
    for the two on make bench's 161 KB plain bodies (4% of the api's CPU a request), numpy ~0.03."""
    data = np.frombuffer(body, np.uint8)
    return 1 + np.count_nonzero(data == ord("{")) + np.count_nonzero(data == ord("[")) - events <= MAX_DEPTH


def shallow_lines(body: bytes) -> bool:
    """Whether no line of `body` holds more than MAX_DEPTH brackets, so no event that is one of its
    lines can nest deeper: for NDJSON bodies whose events nest at all (an object or a list in
    each, where shallow_body says no), one numpy pass instead of counting each line's brackets
    (may_be_deep: ~0.3 against ~0.1 ms per 1,000 such events)."""
    data = np.frombuffer(body, np.uint8)
    opening = np.flatnonzero((data == ord("{")) | (data == ord("[")))
    if not len(opening):
        return True
    line = np.searchsorted(np.flatnonzero(data == ord("\n")), opening)  # the line each is on
    return int(np.bincount(line).max()) <= MAX_DEPTH


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
            return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=_fragment_value)
        except (RecursionError, ValueError):
            return "(the event was too deeply nested to keep its text)"


def _parse_ndjson(body: bytes, max_events: int) -> ParsedBody:
    texts = [raw.strip() for raw in body.split(b"\n")]
    return _parsed_at_once(body, texts, max_events) or _parse_texts(body, texts, "line {}", 1, max_events)


def _parsed_at_once(body: bytes, texts: list[bytes], max_events: int) -> ParsedBody | None:
    """The events of an NDJSON body, read line by line as _parse_texts does but without its work
    for what no line needs (None when one does: _parse_texts then reads them all, with its exact
    errors and events set aside): an event that holds an integer beyond 64 bits (read as a float
    by orjson), is no object, is nested deeper than MAX_DEPTH or has a field name too long for a
    column. A line that is already its event's encoding, byte for byte (what orjson and most
    producers write; then no key is there twice), is kept as sent; any other is the encoding.
    The lines up to the first that is not its encoding are found together (_kept_together), the
    rest read one by one."""
    events = [text for text in texts if text]
    if not events or len(events) > max_events:
        return None
    shallow = shallow_body(body, len(events)) or shallow_lines(body)  # (its events are its lines)
    kept = _kept_together(events) if shallow else 0
    lines = _encoded_lines(body, events[kept:], shallow) if kept < len(events) else []
    if lines is None:
        return None
    if kept:
        lines = events[:kept] + lines if lines else events
    return ParsedBody(ndjson=b"\n".join(lines), events=len(lines))


def _kept_together(events: list[bytes]) -> int:
    """How many of a body's first events are their own encoding (kept as sent, as reading each
    alone would keep them), found by reading them together: msgspec reads a part of the lines in
    one call, orjson encodes what it read in one call, and the part is its events' encodings when
    that equals the lines joined by commas (no space, no other spelling, no key twice, each line
    exactly one object: a line boundary that fell inside an event, or a line of two, would put the
    joining comma where no encoding has one). The parts grow with what was found (so a body that
    turns out to be written otherwise loses at most what the parts before gained) up to
    _TOGETHER, few enough that what they make stays in the CPU's caches (the api paid more for a
    whole body of `pods` at once than for reading line by line). The count stops at the first line
    that is not its encoding: a producer that spells one line otherwise spells others so, and the
    rest are read one by one (trying again after each cost such bodies more than it saved). A body
    whose first line is not its encoding (spaces, other spellings), or whose first event has more
    than _TOGETHER_FIELDS fields, is read one by one at once.
    Measured in the api (`make bench-api`, ms of its CPU per 1,000-event request, two runs each):
    plain 1.37-1.42 against 1.53-1.54, `pods` 2.43-2.50 against 2.54-2.69, `mixed` 1.53-1.56
    against 1.69-1.71, `ledger` (no line its encoding) 2.57-2.70 against 2.60-2.63."""
    first = events[0]
    try:
        value = orjson.loads(first)
        if orjson.dumps(value) != first or type(value) is not dict or _fields(value) > _TOGETHER_FIELDS:
            return 0
    except orjson.JSONDecodeError:
        return 0
    kept, size = 0, _FIRST_TOGETHER
    while kept < len(events):
        part = events[kept:kept + size]
        try:
            values = _OBJECTS.decode_lines(b"\n".join(part))
        except msgspec.DecodeError:  # (msgspec's ValidationError is one)
            break
        try:
            sure = orjson.dumps(values) == b"[" + b",".join(part) + b"]" and (
                max(map(len, part)) <= MAX_FIELD_NAME or not any(map(_named_too_long, part, values)))
        except orjson.JSONEncodeError:
            sure = False
        if not sure:  # the part's lines up to the first that is not its event's encoding
            return kept + next((index for index, (text, value) in enumerate(zip(part, values))
                                if _named_too_long(text, value) or _encoding(value) != text), min(len(part), len(values)))
        kept += len(part)
        size = min(kept, _TOGETHER)
    return kept


def _fields(value: dict) -> int:
    """How many fields `value` has, at any depth through objects."""
    return sum(map(len, _objects(value)))


def _named_too_long(text: bytes, value: dict) -> bool:
    """Whether `value` (the event of line `text`) has a field named too long for a column: only a
    line longer than the longest name can."""
    return len(text) > MAX_FIELD_NAME and _has_long_name(value)


def _encoding(value: dict) -> bytes | None:
    """orjson's encoding of `value`, or None where it has none."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:  # an integer beyond 64 bits
        return None


def _encoded_lines(body: bytes, events: list[bytes], shallow: bool) -> list[bytes] | None:
    """Each of `events` (lines of `body`) kept as sent or encoded again, read alone; None when
    one needs _parse_texts (see _parsed_at_once)."""
    long_numbers: bool | None = None  # whether the body may hold a number orjson changes, looked at once a line is encoded again
    lines = []
    for text in events:
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError:
            return None
        if type(value) is not dict:
            return None
        if not shallow and may_be_deep(text) and deeper_than(value, MAX_DEPTH):
            return None
        # Only an event longer than the longest name can have one (its text or its encoding).
        if len(text) > MAX_FIELD_NAME and _has_long_name(value):  # (inline: _named_too_long's call cost this loop 2%)
            return None
        line = orjson.dumps(value)
        # A number orjson changes (an integer beyond 64 bits, digits a double cannot keep) is
        # written back otherwise: a line spelled as its encoding holds none (looking at every body
        # first cost the api a tenth of its CPU). Once a line is not, the whole body is looked at
        # once (looking at each such line alone made a body written with spaces 75% dearer to
        # read), and then only where it may hold one, each such line is read again exactly.
        if line != text:
            if long_numbers is None:
                long_numbers = may_hold_long_numbers(body)
            if long_numbers:
                # A line that differs from its encoding only in its digits (a number orjson
                # spells otherwise: a decimal of 22 digits among compact JSON) is its exact
                # encoding already: kept as sent, without reading it again (that cost `ledger`'s
                # api twice its CPU), as _parse_texts reads it exactly.
                if _without_digits(text) == _without_digits(line):
                    line = text
                elif may_hold_long_numbers(text):
                    line = orjson.dumps(exact_event(text))
        # Each event is let go at once: holding a body's nested events all together cost the
        # api more in garbage collection than the per-event work saved (measured; _kept_together
        # holds a part's at most).
        lines.append(text if line == text else line)
    return lines


def _parse_texts(body: bytes, texts: list[bytes], where: str, first: int, max_events: int) -> ParsedBody:
    """The events of `texts` (JSON texts; blank ones skipped) one by one: an event nested deeper
    than JSON parsing allows is set aside, anything else that is not a JSON object refuses the
    request, saying where (`where` formatted with the text's number, counted from `first`)."""
    lines: list[bytes] = []
    long_numbers = may_hold_long_numbers(body)  # once per body: only then is each event's text looked at
    shallow = shallow_body(body, sum(1 for text in texts if text))
    for number, text in enumerate(texts, start=first):
        if not text:
            continue
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            if str(exc).startswith("depth limit exceeded") and text.startswith(b"{"):
                event = [set_aside_line(f"the event nests objects or arrays deeper than JSON parsing allows ({exc})", text.decode(errors="replace"))]
            else:
                raise BadRequestBody(f"{where.format(number)}: {_malformed(body, exc)}; nothing from this request was accepted") from exc
        else:
            if not isinstance(value, dict):
                raise BadRequestBody(f"{where.format(number)}: expected a JSON object, got {type(value).__name__}")
            # In a body that may hold a number orjson's reading changes, a line that may hold one,
            # or whose encoding differs from it only in digits (a number spelled otherwise:
            # `1e-07`), is read exactly: kept as spelled, as _encoded_lines keeps such a line.
            exact = long_numbers and (may_hold_long_numbers(text) or _respelled_numbers(value, text))
            event = event_lines(exact_event(text) if exact else value, text, shallow)
        lines.extend(event)
        if len(lines) > max_events:
            raise too_many_events(max_events)
    if not lines:
        raise BadRequestBody("the body holds no events")
    return parsed_body(lines)


def parsed_body(lines: list[bytes]) -> ParsedBody:
    """The writer's lines as a request's events, counting those set aside only when there are any."""
    ndjson = b"\n".join(lines)
    any_aside = ndjson.startswith(SET_ASIDE_MARK) or b"\n" + SET_ASIDE_MARK in ndjson
    return ParsedBody(ndjson=ndjson, events=len(lines), set_aside=set_aside(lines) if any_aside else 0)


def made_events(events: Iterable[dict], max_events: int) -> ParsedBody | None:
    """Events Calve made itself (a shipper's request decoded) as the writer's lines, each checked as
    a request's event is (event_lines), without encoding them to be parsed again; None for none."""
    lines: list[bytes] = []
    for event in events:
        lines.extend(event_lines(event))
        if len(lines) > max_events:
            raise too_many_events(max_events)
    if not lines:
        return None
    return parsed_body(lines)


def _parse_json(body: bytes, max_events: int) -> ParsedBody:
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        if str(exc).startswith("depth limit exceeded"):
            # An event nested deeper than JSON parsing allows is set aside, as in NDJSON: the
            # body's events are parsed one by one.
            stripped = body.strip()
            elements = [stripped] if stripped.startswith(b"{") else array_elements(stripped)
            if elements is not None:
                where = "the body" if stripped.startswith(b"{") else "element {}"
                return _parse_texts(body, elements, where, 0, max_events)
        hint = " (for one object per line, send Content-Type: application/x-ndjson)" if b"\n" in body.strip() else ""
        raise BadRequestBody(f"{_malformed(body, exc)}{hint}") from exc
    if may_hold_long_numbers(body):
        value = exact_event(body)
    events = [value] if isinstance(value, dict) else value
    if not isinstance(events, list):
        raise BadRequestBody(f"expected a JSON object or an array of objects, got {type(value).__name__}")
    if not events:
        raise BadRequestBody("the body holds no events")
    if len(events) > max_events:
        raise too_many_events(max_events)
    for index, event in enumerate(events):
        if not isinstance(event, dict):
            raise BadRequestBody(f"element {index}: expected a JSON object, got {type(event).__name__}")
    lines = [line for event in events for line in event_lines(event)]
    return parsed_body(lines)


# A JSON string (with its escapes) or one of the characters that shape an array: what splitting
# an array into its elements needs to see. Strings are matched whole, so brackets in them do not count.
_ARRAY_TOKENS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{},]')


def array_elements(text: bytes) -> list[bytes] | None:
    """The texts of the elements of the JSON array `text` (stripped), without parsing them: how a
    body orjson cannot read whole (an element nested too deep) is read element by element. None
    when `text` is not one array."""
    if not text.startswith(b"["):
        return None
    elements: list[bytes] = []
    depth, begin = 0, 0
    for token in _ARRAY_TOKENS.finditer(text):
        mark = token.group()
        if mark[:1] == b'"':
            continue
        if mark in (b"[", b"{"):
            depth += 1
            if depth == 1:
                begin = token.end()
        elif mark in (b"]", b"}"):
            depth -= 1
            if depth == 0:
                last = text[begin:token.start()].strip()
                if last or elements:
                    elements.append(last)
                # An empty element (`[{},,{}]`) or anything after the array: not one array.
                return elements if all(elements) and not text[token.end():].strip() else None
        elif depth == 1:
            elements.append(text[begin:token.start()].strip())
            begin = token.end()
    return None


def _malformed(body: bytes, exc: orjson.JSONDecodeError) -> str:
    """Why the body is no JSON, in terms a producer can act on: a body that is not UTF-8 text
    (compressed without saying so, or in another encoding) is named as such."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as bad:
        if body.startswith(b"\x1f\x8b"):
            return "the body is gzip-compressed but no Content-Encoding says so; send the header Content-Encoding: gzip"
        if body.startswith((b"\xff\xfe", b"\xfe\xff")) or body[:64].count(b"\x00") >= 8:
            return "the body looks like UTF-16 text; JSON must be sent as UTF-8"
        return (f"the body is not UTF-8 text (byte 0x{body[bad.start]:02x} at offset {bad.start}); JSON must be sent as UTF-8: "
                "re-encode it (for example from latin-1) or escape the characters as \\uXXXX")
    return f"malformed JSON ({exc})"


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
        out.extend(event_lines(exact_event(text) if may_hold_long_numbers(text) else value, text))
    return parsed_body(out)


def set_aside(lines: list[bytes]) -> int:
    """How many of the writer's lines are events set aside for the DLQ."""
    return sum(line.startswith(SET_ASIDE_MARK) for line in lines)
