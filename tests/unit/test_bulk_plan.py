"""An Elasticsearch _bulk body planned all at once (elastic._plan_alike, the body shippers send:
one action line before every document) against item by item (elastic._plan_each): the same
answer items, the same lines per pipeline, whenever the first answers; and it answers for the
shippers' bodies."""

from __future__ import annotations

import json
from types import SimpleNamespace

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.api.events import MAX_DEPTH, may_hold_long_integers
from service.api.routes import elastic
from service.core.exceptions import NotFound

IDS = "0123456789abcdef01234567"
APPENDS = SimpleNamespace(definition=SimpleNamespace(sinks=[]))
CHANGES = SimpleNamespace(definition=SimpleNamespace(sinks=[SimpleNamespace(identifier_columns=["id"], operation="op")]))
PIPELINES = {"logs": APPENDS, "people": CHANGES}


def load(name: str) -> SimpleNamespace:
    if name not in PIPELINES:
        raise NotFound(f"no pipeline {name!r}")
    return PIPELINES[name]


def deep(depth: int) -> dict:
    value: dict = {"leaf": 1}
    for _ in range(depth):
        value = {"in": value}
    return value


objects = st.dictionaries(st.sampled_from(["msg", "level", "n", "id", "x" * 1100]),
                          st.one_of(st.text(max_size=8), st.integers(-(2**70), 2**70), st.floats(allow_nan=False), st.booleans(), st.none()),
                          max_size=4).map(lambda value: json.dumps(value).encode())  # integers past 64 bits too
documents = st.one_of(
    objects,
    st.sampled_from([b"[1, 2]", b"not json", b'"text"', b"{}"]),
    st.integers(MAX_DEPTH - 1, MAX_DEPTH + 2).map(lambda depth: orjson.dumps(deep(depth))),
    st.just(b"[" * 300 + b"]" * 300),
)
actions = st.one_of(
    st.sampled_from([b'{"index":{"_index":"logs"}}', b'{"create":{"_index":"logs"}}', b'{"index":{}}', b'{"index":{"_index":"people"}}',
                     b'{"index":{"_index":"nowhere"}}', b'{"index":{"_index":"logs","_id":"a"}}', b'{"update":{"_index":"logs"}}']),
)


# Any items; or the shippers' bodies: one action line before each of documents that are objects.
shipper_items = st.builds(lambda action, documents: [(action, document) for document in documents],
                          st.sampled_from([b'{"index":{"_index":"logs"}}', b'{"create":{"_index":"logs"}}', b'{"index":{}}']),
                          st.lists(objects, min_size=1, max_size=8))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.lists(st.tuples(actions, documents), min_size=1, max_size=6), shipper_items), st.sampled_from([None, "logs"]))
def test_a_bulk_body_planned_all_at_once_is_planned_as_item_by_item(items: list[tuple[bytes, bytes]], default_index: str | None) -> None:
    body = b"\n".join(line for item in items for line in item) + b"\n"
    lines = [line for line in body.split(b"\n") if line.strip()]
    at_once = elastic._plan_alike(lines, default_index, load, IDS)
    if at_once is None:
        return
    each_items, each_targets = elastic._plan_each(lines, default_index, load, IDS, may_hold_long_integers(body))
    created, targets_at_once = at_once
    assert created.items() == each_items
    assert orjson.loads(orjson.dumps(created.encoded())) == each_items, "the answer's items written straight to JSON"
    assert {name: (target.events(), target.items) for name, target in targets_at_once.items()} == {
        name: (target.events(), target.items) for name, target in each_targets.items()}


def test_the_shippers_bodies_are_planned_all_at_once() -> None:
    """Filebeat's and Logstash's shape: the same action line before each document."""
    events = [{"msg": f"m{i}", "n": i, "nested": {"a": [1, 2]}} for i in range(50)]
    body = b"".join(b'{"create":{"_index":"logs"}}\n' + orjson.dumps(event) + b"\n" for event in events)
    lines = [line for line in body.split(b"\n") if line.strip()]
    planned = elastic._plan_alike(lines, None, load, IDS)
    assert planned is not None
    created, targets = planned
    assert [orjson.loads(line) for line in targets["logs"].events().ndjson.split(b"\n")] == events
    assert created.items() == elastic._plan_each(lines, None, load, IDS, False)[0]
    assert elastic._plan_alike(lines[:-1], None, load, IDS) is None, "an action without its document: item by item, which says so"
