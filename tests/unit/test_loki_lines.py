"""A Loki push's lines put together from their parts (routes/loki.parsed_push, loki.event_texts)
against each line made an event (loki.event) and checked and encoded as any event Calve makes is
(made_events): the same writer's lines, byte for byte, in JSON and in protobuf."""

from __future__ import annotations

import cramjam
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.api.events import MAX_FIELD_NAME, made_events
from service.api.routes.loki import parsed_push
from service.core.exceptions import BadRequestBody, BodyTooLarge
from service.pipelines import loki

MAX_BYTES = 1 << 26

# Keys now and then longer than a column name may be (the events made go through made_events' check).
keys = st.one_of(st.text(min_size=1, max_size=8), st.just("k" * (MAX_FIELD_NAME + 1)))
texts = st.text(max_size=16)  # unicode, quotes, backslashes, control characters
maps = st.dictionaries(keys, texts, max_size=3)
nanos = st.integers(0, 10**19 - 1)
lines = st.tuples(nanos, texts, st.one_of(st.just({}), maps))
streams = st.lists(st.tuples(maps, st.lists(lines, max_size=5)), max_size=4)


def json_push(pushed: list) -> bytes:
    return orjson.dumps({"streams": [
        {"stream": labels, "values": [[str(ns), line, metadata] if metadata else [str(ns), line] for ns, line, metadata in values]}
        for labels, values in pushed
    ]})


def protobuf_push(pushed: list) -> bytes:
    request = loki.PushRequest()
    for labels, values in pushed:
        stream = request.streams.add(labels="{" + ", ".join(f"{key}={orjson.dumps(value).decode()}" for key, value in labels.items()) + "}")
        for ns, line, metadata in values:
            entry = stream.entries.add(line=line)
            entry.timestamp.seconds, entry.timestamp.nanos = divmod(ns, 1_000_000_000)
            for key, value in metadata.items():
                entry.structuredMetadata.add(name=key, value=value)
    return bytes(cramjam.snappy.compress_raw(request.SerializeToString()))


def events_made(body: bytes, protobuf: bool):  # noqa: ANN201 - ParsedBody | None
    return made_events((loki.event(*entry) for entry in loki.entries(body, protobuf, MAX_BYTES)), 10_000)


@pytest.mark.parametrize("protobuf", [False, True], ids=["json", "protobuf"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pushed=streams)
def test_a_push_gives_the_lines_its_events_would(protobuf: bool, pushed: list) -> None:
    if protobuf:  # label names as Prometheus spells them; the protobuf's label text cannot carry others
        pushed = [({f"l{i}": value for i, value in enumerate(labels.values())}, values) for labels, values in pushed]
    body = protobuf_push(pushed) if protobuf else json_push(pushed)
    expected, got = events_made(body, protobuf), parsed_push(body, protobuf, MAX_BYTES, 10_000)
    if expected is None:
        assert got is None
        return
    assert got is not None
    assert (got.ndjson, got.events, got.set_aside) == (expected.ndjson, expected.events, expected.set_aside)


def test_lines_of_two_streams_keep_their_own_labels_and_long_keys_are_set_aside_as_before() -> None:
    long_key = "k" * (MAX_FIELD_NAME + 1)
    body = json_push([({"job": "a"}, [(1, "one", {})]), ({"job": "b"}, [(2, "two", {"trace": "t"})]),
                      ({long_key: "x"}, [(3, "three", {})]), ({"job": "c"}, [(4, "four", {long_key: "y"})])])
    got = parsed_push(body, False, MAX_BYTES, 10_000)
    assert got.ndjson == events_made(body, False).ndjson
    rows = got.ndjson.split(b"\n")
    assert [orjson.loads(row)["labels"] for row in rows[:2]] == [{"job": "a"}, {"job": "b"}]
    assert orjson.loads(rows[1])["structured_metadata"] == {"trace": "t"}
    assert got.set_aside == 2, "the events with a key longer than a column name may be are set aside, as any event's are"


def test_a_push_over_the_events_limit_or_with_a_bad_line_is_refused() -> None:
    body = json_push([({"job": "a"}, [(i, "x", {}) for i in range(11)])])
    with pytest.raises(BodyTooLarge):
        parsed_push(body, False, MAX_BYTES, 10)
    with pytest.raises(BadRequestBody, match="nanoseconds since 1970"):
        parsed_push(b'{"streams": [{"stream": {}, "values": [["-1", "x"]]}]}', False, MAX_BYTES, 10)
    assert parsed_push(b'{"streams": []}', False, MAX_BYTES, 10) is None
