"""One tenant's bad input costs only itself: events nested too deep, keys that collide, requests
Spark cannot run and entries that keep crashing their writers go to the DLQ with a reason, and the
rest is written. Against the real Redis, Spark Connect and Iceberg tables read back."""

from __future__ import annotations

import time

import orjson
import pytest

from service.api.events import MAX_DEPTH
from service.core import keys
from tests.conftest import Stack, wait_until
from tests.integration.test_pipelines import create, dlq

pytestmark = pytest.mark.spark

EVOLVING = {"name": "nested", "source": {"http": {"path": "/nested"}},
            "sinks": [{"table": "nested", "auto_create": True, "schema_evolution": True}]}


def nested(event_id: int, depth: int) -> dict:
    """An event whose objects nest `depth` levels deep, the event itself counting as one."""
    value: object = 1
    for _ in range(depth - 1):
        value = {"a": value}
    return {"id": event_id, "a": value} if depth > 1 else {"id": event_id}


def post(stack: Stack, path: str, body: bytes, content_type: str) -> dict:
    with stack.client() as http:
        answer = http.post(f"{path}?wait=true&timeout=90", content=body, headers={"Content-Type": content_type})
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_an_event_nested_too_deep_goes_to_the_dlq_and_the_rest_of_its_request_is_written(stack: Stack) -> None:
    create(stack, EVOLVING)
    ndjson = b"\n".join(orjson.dumps(e) for e in (nested(1, 1), nested(2, 33), nested(3, MAX_DEPTH)))
    array = orjson.dumps([nested(4, 1), nested(5, MAX_DEPTH + 1), nested(6, MAX_DEPTH)])
    assert post(stack, "/nested", ndjson, "application/x-ndjson")["dlq_events"] == 1
    assert post(stack, "/nested", array, "application/json")["dlq_events"] == 1
    rows = {row["id"]: row for row in stack.rows("nested")}
    assert sorted(rows) == [1, 3, 4, 6]
    deepest = rows[3]["a"]
    for _ in range(MAX_DEPTH - 2):
        deepest = deepest["a"]
    assert deepest == {"a": 1}, "an event exactly MAX_DEPTH deep is written whole"
    entries = dlq(stack)
    assert sorted(orjson.loads(entry["event"])["id"] for entry in entries) == [2, 5], "kept with its original text"
    assert all(f"more than {MAX_DEPTH} levels deep" in entry["reason"] for entry in entries)


def test_the_reported_poison_event_on_logs_leaves_the_writers_free(stack: Stack) -> None:
    poison = b'{"msg":"x","a":' + b'{"a":' * 32 + b"1" + b"}" * 32 + b"}"
    first = post(stack, "/logs", poison + b'\n{"msg":"fine"}', "application/x-ndjson")
    assert first["dlq_events"] == 1
    assert post(stack, "/logs", b'{"msg":"after"}', "application/x-ndjson")["dlq_events"] == 0
    assert sorted(row["msg"] for row in stack.rows()) == ["after", "fine"]


def test_duplicate_keys_keep_the_last_value_and_keys_differing_in_case_are_two_columns(stack: Stack) -> None:
    create(stack, EVOLVING)
    ndjson = b'{"id":1,"dup":"first","dup":"second"}\n{"id":2,"Msg":"a","msg":"b","n":{"k":1,"k":2}}'
    array = b'[{"id":3,"dup":"first","dup":"second"},{"id":4,"Msg":"c","msg":"d","n":{"k":3,"K":4}}]'
    assert post(stack, "/nested", ndjson, "application/x-ndjson")["dlq_events"] == 0
    assert post(stack, "/nested", array, "application/json")["dlq_events"] == 0
    rows = {row["id"]: row for row in stack.rows("nested")}
    assert rows[1]["dup"] == rows[3]["dup"] == "second", "as a JSON array body does: the last value wins"
    assert (rows[2]["Msg"], rows[2]["msg"], rows[4]["Msg"], rows[4]["msg"]) == ("a", "b", "c", "d")
    assert rows[2]["n"]["k"] == 2 and (rows[4]["n"]["k"], rows[4]["n"]["K"]) == (3, 4)


def test_an_entry_taken_up_too_often_goes_to_the_dlq_instead_of_looping(stack_factory) -> None:  # noqa: ANN001
    stack = stack_factory(roles=("api",), CALVE_WRITER_CLAIM_IDLE_S="2")
    stream = keys.input_stream_key("demo", "logs")
    with stack.client() as http:
        receipt = http.post("/logs", json={"msg": "crashes its writers"}).json()["receipt"]
    # Writers that read the entry and died before settling it, again and again: Redis counts each
    # read and each claim as a delivery (XCLAIM is how a reclaiming writer takes it).
    stack.redis.xgroup_create(stream, keys.WRITER_GROUP, id="0", mkstream=True)
    (_stream, [(entry_id, _fields)]), = stack.redis.xreadgroup(keys.WRITER_GROUP, "crashed", {stream: ">"})
    for _ in range(5):
        stack.redis.xclaim(stream, keys.WRITER_GROUP, "crashed", min_idle_time=0, message_ids=[entry_id])
    assert stack.redis.xpending_range(stream, keys.WRITER_GROUP, "-", "+", 1)[0]["times_delivered"] == 6
    stack.start("writer")
    stack.start("committer")
    with stack.client() as http:
        wait_until(lambda: http.get(f"/v1/receipts/{receipt}").json()["status"] == "committed", timeout_s=90, what="settled")
        listed = http.get("/v1/dlq").json()["entries"]
    assert [orjson.loads(e["event"]) for e in listed] == [{"msg": "crashes its writers"}]
    assert "taken up 5 times" in listed[0]["reason"]
    assert stack.rows() == [], "never written to its table"
    assert stack.redis.xlen(stream) == 0


def test_a_failing_tenant_does_not_hold_up_another_tenants_commits(stack: Stack) -> None:
    """Tenant demo's pipeline fails every job it runs (each request must be isolated and retried
    before it reaches the DLQ); meanwhile tenant beta's requests are committed as usual."""
    from sqlmodel import Session

    from service.core.db import get_engine
    from service.tenancy.tenants import create_tenant, issue_token

    with Session(get_engine(stack.settings.resolved_database_url())) as session:
        _row, beta_token = issue_token(session, create_tenant(session, "beta"))
    create(stack, {"name": "broken", "source": {"http": {"path": "/broken"}},
                   "processors": [{"where": "size(level) > 0"}], "sinks": [{"table": "broken", "auto_create": True}]})
    with stack.client() as http:
        poison = [http.post("/broken", json={"level": f"l{i}"}).json()["receipt"] for i in range(40)]
    started = time.monotonic()
    with stack.client(beta_token) as http:
        answer = http.post("/logs?wait=true&timeout=90", json={"msg": "beta"})
    assert answer.status_code == 200 and answer.json()["status"] == "committed", answer.text
    with stack.client() as http:
        settled = [http.get(f"/v1/receipts/{r}").json()["status"] for r in poison]
    # Each poison request costs at least two failing jobs alone, and halving them out of their
    # batch more: beta's commit did not wait for all of that.
    assert settled.count("committed") < len(poison), (time.monotonic() - started, settled)
    assert [row["msg"] for row in stack.rows(tenant="beta")] == ["beta"]
