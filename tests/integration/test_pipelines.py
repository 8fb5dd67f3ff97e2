"""Pipelines end to end: processors, routes, partitioned and dynamic tables, conversion and the
DLQ, against the real Redis, Spark Connect and Iceberg tables read back."""

from __future__ import annotations

import base64
from datetime import date, datetime, time, timezone
from decimal import Decimal
from time import sleep as pause

import orjson
import pyarrow.parquet as pq
import pytest

from service.core import keys
from tests.conftest import Stack

pytestmark = pytest.mark.spark

CHECKOUT = """
name: checkout
source: {http: {path: /checkout}}
processors:
  - where: "kind != 'heartbeat'"
  - set: {amount_eur: "amount / 100.0", status: "cast(code as int)"}
  - drop: [debug, code]
  - rename: {svc: service}
routes:
  errors: "status >= 500"
  slow: "latency_ms > 1000"
sinks:
  - table: checkout_errors
    routes: [errors]
    auto_create: true
    schema:
      columns:
        - {name: ts, type: timestamptz, required: true}
        - {name: status, type: int, required: true}
        - {name: service, type: string}
        - {name: amount_eur, type: double}
      partition_spec: [{column: ts, transform: day}]
  - table: checkout_slow
    routes: [slow]
    auto_create: true
  - table: checkout_all
    auto_create: true
"""


def create(stack: Stack, body: str | dict) -> dict:
    with stack.client() as http:
        if isinstance(body, str):
            answer = http.post("/v1/pipelines", content=body, headers={"Content-Type": "application/yaml"})
        else:
            answer = http.post("/v1/pipelines", json=body)
    assert answer.status_code == 201, answer.text
    return answer.json()


def send(stack: Stack, path: str, events: list[dict]) -> dict:
    with stack.client() as http:
        body = b"\n".join(orjson.dumps(e) for e in events)
        answer = http.post(f"{path}?wait=true&timeout=90", content=body, headers={"Content-Type": "application/x-ndjson"})
    assert answer.status_code == 200, answer.text
    return answer.json()


def dlq(stack: Stack) -> list[dict]:
    return stack.rows(keys.DLQ_TABLE)


def test_processors_routes_and_a_partitioned_table(stack: Stack) -> None:
    create(stack, CHECKOUT)
    answer = send(stack, "/checkout", [
        {"kind": "order", "ts": "2024-05-01T10:00:00Z", "code": "503", "amount": 1250, "svc": "pay", "latency_ms": 1500, "debug": "x"},
        {"kind": "order", "ts": "2024-05-02T11:00:00Z", "code": "500", "amount": 100, "svc": "cart", "latency_ms": 20, "debug": "y"},
        {"kind": "order", "ts": "2024-05-02T12:00:00Z", "code": "200", "amount": 5, "svc": "cart", "latency_ms": 2000},
        {"kind": "heartbeat", "ts": "2024-05-03T00:00:00Z", "code": "500", "latency_ms": 5000},
    ])
    assert set(answer["tables"]) == {"checkout_errors", "checkout_slow", "checkout_all"}
    assert answer["dlq_events"] == 0

    errors = sorted(stack.rows("checkout_errors"), key=lambda r: r["ts"])
    assert [(r["status"], r["service"], r["amount_eur"]) for r in errors] == [(503, "pay", 12.5), (500, "cart", 1.0)]
    assert errors[0]["ts"] == datetime(2024, 5, 1, 10, tzinfo=timezone.utc)

    # One partition value per file, and the partition's source column kept inside the file.
    table = stack.catalog().load_table(("demo", "checkout_errors"))
    files = table.inspect.files().to_pylist()
    assert len(files) == 2
    assert sorted(f["partition"]["ts_day"] for f in files) == [date(2024, 5, 1), date(2024, 5, 2)]
    for f in files:
        in_file = pq.read_table(f["file_path"].removeprefix("file://"))
        assert "ts" in in_file.column_names
        assert len({ts.date() for ts in in_file.column("ts").to_pylist()}) == 1

    slow = stack.rows("checkout_slow")
    assert sorted(r["latency_ms"] for r in slow) == [1500, 2000]
    slow_columns = set(stack.catalog().load_table(("demo", "checkout_slow")).schema().column_names)
    assert {"service", "amount_eur", "status", "ts"} <= slow_columns
    assert not {"debug", "code", "svc"} & slow_columns, "dropped and renamed fields are gone"

    everything = stack.rows("checkout_all")
    assert sorted(r["status"] for r in everything) == [200, 500, 503], "the heartbeat was filtered out"


def test_dynamic_table_names_create_one_table_each(stack: Stack) -> None:
    create(stack, {"name": "events", "source": {"http": {"path": "/events"}}, "sinks": [{"table": "${service}_events", "auto_create": True}]})
    answer = send(stack, "/events", [
        {"service": "pay", "amount": 3},
        {"service": "Pay", "amount": 4},
        {"service": "cart", "items": 2},
        {"service": "bad name!", "x": 1},
        {"no_service": True},
    ])
    assert answer["dlq_events"] == 2
    with stack.client() as http:
        tables = http.get("/v1/tables").json()["tables"]
    assert {"pay_events", "cart_events"} <= set(tables) and len(tables) == 3  # and the DLQ
    assert sorted(r["amount"] for r in stack.rows("pay_events")) == [3, 4]
    assert "amount" not in stack.catalog().load_table(("demo", "cart_events")).schema().column_names, "each table infers its own"
    reasons = [r["reason"] for r in dlq(stack)]
    assert any("'bad name!_events'" in r and "is not valid" in r for r in reasons), reasons
    assert any("lacks a field" in r for r in reasons), reasons


COERCION_SCHEMA = {
    "columns": [
        {"name": "id", "type": "string", "required": True},
        {"name": "seq", "type": "long", "required": True},
        {"name": "n_int", "type": "int"},
        {"name": "n_long", "type": "long"},
        {"name": "f_double", "type": "double"},
        {"name": "dec", "type": "decimal(10,2)"},
        {"name": "flag", "type": "boolean"},
        {"name": "day", "type": "date"},
        {"name": "ts", "type": "timestamptz"},
        {"name": "local_ts", "type": "timestamp"},
        {"name": "blob", "type": "binary"},
        {"name": "tags", "type": "list<long>"},
        {"name": "attrs", "type": "map<string, long>"},
        {"name": "nested", "type": "struct<a: int, b: string>"},
        {"name": "at", "type": "time"},
    ]
}


def test_every_conversion_and_mismatch_rule(stack: Stack) -> None:
    create(stack, {"name": "typed", "source": {"http": {"path": "/typed"}}, "sinks": [{"table": "typed", "auto_create": True, "schema": COERCION_SCHEMA}]})
    epoch_day = (date(2024, 5, 1) - date(1970, 1, 1)).days
    events = [
        # exact types
        {"id": "exact", "seq": 1, "n_int": 1, "n_long": 2, "f_double": 1.5, "dec": 12.34, "flag": True, "day": "2024-05-01",
         "ts": "2024-05-01T10:00:00Z", "local_ts": "2024-05-01 10:00:00", "blob": base64.b64encode(b"hello").decode(),
         "tags": [1, 2], "attrs": {"x": 1}, "nested": {"a": 1, "b": "s"}, "at": "10:11:12.5"},
        # coercible wrong types; an extra field; missing optional fields
        {"id": "coerced", "seq": "2", "n_int": "7", "n_long": "12.0", "f_double": "2.5", "dec": "3.5", "flag": "yes",
         "day": epoch_day, "ts": 1714557600000, "tags": ["3", 4.0], "attrs": {"y": "5"}, "nested": {"a": "2"}, "extra": "ignored",
         "at": 36672000},
        # not coercible, optional columns: NULL, the row is kept
        {"id": "nulled", "seq": 3, "n_int": "abc", "flag": "maybe", "ts": "not a time", "blob": "!!not base64!!", "n_long": 3000000000,
         "dec": "12345678901.5", "at": "25:99"},
        {"id": 42, "seq": 4, "n_int": 3000000000, "ts": "2024-05-01T12:00:00.5+02:00"},
        # to the DLQ
        {"seq": 5, "n_int": 1},
        {"id": "bad-seq", "seq": "five"},
        {"unrelated": 1},
    ]
    answer = send(stack, "/typed", events)
    assert answer["dlq_events"] == 3 and answer["tables"]["typed"]["rows"] == 4

    rows = {r["id"]: r for r in stack.rows("typed")}
    assert set(rows) == {"exact", "coerced", "nulled", "42"}
    exact = rows["exact"]
    assert (exact["n_int"], exact["n_long"], exact["f_double"], exact["dec"], exact["flag"]) == (1, 2, 1.5, Decimal("12.34"), True)
    assert exact["day"] == date(2024, 5, 1) and exact["ts"] == datetime(2024, 5, 1, 10, tzinfo=timezone.utc)
    assert exact["local_ts"] == datetime(2024, 5, 1, 10) and exact["blob"] == b"hello"
    assert exact["tags"] == [1, 2] and dict(exact["attrs"]) == {"x": 1} and exact["nested"] == {"a": 1, "b": "s"}
    assert exact["at"] == time(10, 11, 12, 500000)

    coerced = rows["coerced"]
    assert (coerced["seq"], coerced["n_int"], coerced["n_long"], coerced["f_double"]) == (2, 7, 12, 2.5)
    assert (coerced["dec"], coerced["flag"], coerced["day"]) == (Decimal("3.50"), True, date(2024, 5, 1))
    assert coerced["ts"] == datetime(2024, 5, 1, 10, tzinfo=timezone.utc), "epoch milliseconds"
    assert coerced["tags"] == [3, 4] and dict(coerced["attrs"]) == {"y": 5} and coerced["nested"] == {"a": 2, "b": None}
    assert coerced["local_ts"] is None and coerced["blob"] is None, "missing optional fields are NULL"
    assert coerced["at"] == time(10, 11, 12), "milliseconds since midnight"

    nulled = rows["nulled"]
    assert [nulled[c] for c in ("n_int", "flag", "ts", "blob", "dec", "at")] == [None] * 6
    assert nulled["n_long"] == 3000000000, "a long holds what an int cannot"
    assert rows["42"]["n_int"] is None, "out of int range"
    assert rows["42"]["ts"] == datetime(2024, 5, 1, 10, 0, 0, 500000, tzinfo=timezone.utc), "an offset is honoured"

    dead = {r["reason"]: r for r in dlq(stack)}
    assert set(dead) == {
        "missing required field 'id'",
        "field 'seq' cannot be converted to bigint",
        "no field of the event matches a column of table 'typed'",
    }
    entry = dead["field 'seq' cannot be converted to bigint"]
    assert orjson.loads(entry["event"]) == {"id": "bad-seq", "seq": "five"}, "the original event is kept"
    assert (entry["pipeline"], entry["table"], entry["receipt"]) == ("typed", "typed", answer["receipt"])
    assert entry["failed_at"] is not None and entry["dlq_id"]


def test_a_static_table_that_may_not_be_created_is_checked_at_creation_and_events_filtered_away_commit(stack: Stack) -> None:
    create(stack, {
        "name": "quiet", "source": {"http": {"path": "/quiet"}},
        "processors": [{"where": "level = 'error'"}],
        "sinks": [{"table": "quiet", "auto_create": True}],
    })
    answer = send(stack, "/quiet", [{"level": "debug"}, {"level": "info"}])
    assert answer["status"] == "committed" and answer["tables"] == {} and answer["dlq_events"] == 0
    with stack.client() as http:
        assert "quiet" not in http.get("/v1/tables").json()["tables"], "no rows, no table"
    assert int(stack.redis.get(keys.backlog_key("demo"))) == 0


ORDERS = {
    "name": "orders", "source": {"http": {"path": "/orders"}},
    "sinks": [{"table": "orders", "auto_create": True, "schema": {"columns": [
        {"name": "id", "type": "string", "required": True},
        {"name": "amount", "type": "long", "required": True},
    ]}}],
}


def wait_committed(stack: Stack, receipt: str) -> dict:
    from tests.conftest import wait_until

    with stack.client() as http:
        return wait_until(
            lambda: (r := http.get(f"/v1/receipts/{receipt}").json())["status"] == "committed" and r,
            timeout_s=90, what=f"receipt {receipt} committed",
        )


def test_dlq_is_listed_filtered_paged_replayed_after_a_fix_and_purged(stack: Stack) -> None:
    create(stack, ORDERS)
    answer = send(stack, "/orders", [
        {"id": "ok", "amount": 5},
        {"id": "text-1", "amount": "five"},
        {"id": "text-2", "amount": "six"},
        {"amount": 7},
    ])
    assert answer["dlq_events"] == 3
    with stack.client() as http:
        everything = http.get("/v1/dlq").json()
        assert len(everything["entries"]) == 3 and everything["next_cursor"] is None
        first = http.get("/v1/dlq", params={"limit": 2}).json()
        second = http.get("/v1/dlq", params={"limit": 2, "cursor": first["next_cursor"]}).json()
        assert len(first["entries"]) == 2 and len(second["entries"]) == 1 and second["next_cursor"] is None
        assert {e["dlq_id"] for e in first["entries"] + second["entries"]} == {e["dlq_id"] for e in everything["entries"]}
        converted = http.get("/v1/dlq", params={"reason": "cannot be converted"}).json()["entries"]
        assert sorted(orjson.loads(e["event"])["id"] for e in converted) == ["text-1", "text-2"]
        assert http.get("/v1/dlq", params={"table": "elsewhere"}).json()["entries"] == []

        # Fix the pipeline: words become numbers; replay the conversion failures only.
        fixed = ORDERS | {"processors": [{"set": {"amount": "CASE amount WHEN 'five' THEN 5 WHEN 'six' THEN 6 ELSE amount END"}}]}
        assert http.put("/v1/pipelines/orders", json=fixed).status_code == 200
        replay = http.post("/v1/dlq/replay", json={"reason": "cannot be converted"}).json()
        assert replay["replayed"] == 2, replay
        again = http.post("/v1/dlq/replay", json={"reason": "cannot be converted"}).json()
        assert again["replayed"] == 0, "entries being replayed are not replayed twice"
        committed = wait_committed(stack, replay["receipts"]["orders"])
        assert committed["tables"]["orders"]["rows"] == 2 and committed["dlq_events"] == 0

        assert sorted((r["id"], r["amount"]) for r in stack.rows("orders")) == [("ok", 5), ("text-1", 5), ("text-2", 6)]
        left = http.get("/v1/dlq").json()["entries"]
        assert [e["reason"] for e in left] == ["missing required field 'id'"], "replayed entries left the DLQ"
        assert http.post("/v1/dlq/replay", json={"reason": "cannot be converted"}).json()["replayed"] == 0

        assert http.delete("/v1/dlq").status_code == 422, "purging everything needs all=true"
        assert http.delete("/v1/dlq", params={"reason": "missing required"}).json() == {"deleted": 1}
        assert http.get("/v1/dlq").json()["entries"] == []


def test_schema_evolution_adds_fields_while_two_writers_run(stack_factory) -> None:  # noqa: ANN001
    stack = stack_factory(roles=("api", "writer", "committer"))
    stack.start("writer", name="writer-2")
    create(stack, {
        "name": "evolving", "source": {"http": {"path": "/evolving"}},
        "sinks": [{"table": "evolving", "auto_create": True, "schema_evolution": True, "schema": {"columns": [
            {"name": "id", "type": "string", "required": True}, {"name": "n", "type": "int"},
            {"name": "http", "type": "struct<status: long>"},
        ]}}],
    })
    import concurrent.futures

    def post(i: int) -> dict:
        return send(stack, "/evolving", [
            {"id": f"{i}-a", "n": 1, "http": {"status": 200}, "extra": f"x{i}"},
            {"id": f"{i}-b", "n": 3_000_000_000 if i == 3 else 2, "http": {"status": 404, "path": "/p"}, "flag": i % 2 == 0},
        ])

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(post, range(8)))
    assert all(a["dlq_events"] == 0 for a in answers)
    table = stack.catalog().load_table(("demo", "evolving"))
    schema = table.schema()
    assert schema.column_names.count("extra") == 1 and "flag" in schema.column_names
    assert str(schema.find_field("n").field_type) == "long", "int widened to long"
    assert str(schema.find_field("http.path").field_type) == "string", "a nested field was added"
    rows = {r["id"]: r for r in stack.rows("evolving")}
    assert len(rows) == 16
    assert rows["3-b"]["n"] == 3_000_000_000 and rows["5-a"]["extra"] == "x5" and rows["6-b"]["flag"] is True
    assert rows["2-b"]["http"] == {"status": 404, "path": "/p"}


def test_an_evolving_tables_requests_that_need_no_evolution_take_the_short_way(stack: Stack) -> None:
    """Once the table exists, a batch of its own fields in its types is written the short way; one
    with a new field goes to the Spark job, which adds the column; the next batch holding that
    field takes the short way again. The metrics say which way each batch went."""
    create(stack, {"name": "grows", "source": {"http": {"path": "/grows"}},
                   "sinks": [{"table": "grows", "auto_create": True, "schema_evolution": True}]})
    send(stack, "/grows", [{"id": 1, "msg": "creates the table"}])
    send(stack, "/grows", [{"id": 2, "msg": "fits"}, {"id": 3}])
    send(stack, "/grows", [{"id": 4, "msg": "a new field", "region": "eu"}])
    send(stack, "/grows", [{"id": 5, "region": "us"}])
    text = stack.metrics()
    assert 'calve_direct_batches_total{outcome="written",pipeline="grows",tenant="demo"} 2.0' in text, text
    assert 'calve_direct_batches_total{outcome="refused",pipeline="grows",tenant="demo"} 1.0' in text
    rows = sorted(stack.rows("grows"), key=lambda row: row["id"])
    assert [(row["id"], row["msg"], row["region"]) for row in rows] == [
        (1, "creates the table", None), (2, "fits", None), (3, None, None), (4, "a new field", "eu"), (5, None, "us")]


def test_target_file_size_and_truncate_partitions(stack: Stack) -> None:
    create(stack, {
        "name": "sized", "source": {"http": {"path": "/sized"}},
        "sinks": [
            {"table": "sized", "auto_create": True, "target_file_size": 1024 * 1024},
            {"table": "by_prefix", "auto_create": True, "schema": {
                "columns": [{"name": "user", "type": "string"}, {"name": "n", "type": "long"}],
                "partition_spec": [{"column": "user", "transform": "truncate[2]"}],
            }},
            {"table": "by_bucket", "auto_create": True, "schema": {
                "columns": [{"name": "user", "type": "string"}, {"name": "n", "type": "long"}],
                "partition_spec": [{"column": "user", "transform": "bucket[8]"}, {"column": "n", "transform": "bucket[3]"}],
            }},
        ],
    })
    # ~20,000 events of ~300 bytes: ~6 MB of JSON, estimated at ~1.5 MB of Parquet.
    events = [{"user": f"{'abcd'[i % 4]}{'xyz'[i % 3]}-{i}", "n": i, "pad": "p" * 250} for i in range(20_000)]
    with stack.client() as http:
        body = b"\n".join(orjson.dumps(e) for e in events)
        assert http.post("/sized?wait=true&timeout=120", content=body, headers={"Content-Type": "application/x-ndjson"}).status_code == 200
    assert stack.catalog().load_table(("demo", "sized")).properties["write.target-file-size-bytes"] == str(1024 * 1024)
    sized = stack.catalog().load_table(("demo", "sized")).inspect.files().to_pylist()
    assert len(sized) == 2, [f["record_count"] for f in sized]
    assert sum(f["record_count"] for f in sized) == 20_000
    files = stack.catalog().load_table(("demo", "by_prefix")).inspect.files().to_pylist()
    assert sorted(f["partition"]["user_truncate"] for f in files) == sorted(a + b for a in "abcd" for b in "xyz")
    for f in files:
        users = pq.read_table(f["file_path"].removeprefix("file://")).column("user").to_pylist()
        assert {u[:2] for u in users} == {f["partition"]["user_truncate"]}

    # Bucket partitions: each file holds one (user, n) bucket pair, as Iceberg computes them, and a
    # filter on the bucketed column prunes to the files of its bucket.
    from pyiceberg.expressions import EqualTo
    from pyiceberg.transforms import BucketTransform
    from pyiceberg.types import LongType, StringType

    table = stack.catalog().load_table(("demo", "by_bucket"))
    user_bucket, n_bucket = BucketTransform(8).transform(StringType()), BucketTransform(3).transform(LongType())
    files = table.inspect.files().to_pylist()
    assert len(files) == 24 and sum(f["record_count"] for f in files) == 20_000
    for f in files:
        rows = pq.read_table(f["file_path"].removeprefix("file://")).to_pylist()
        assert {(user_bucket(r["user"]), n_bucket(r["n"])) for r in rows} == {(f["partition"]["user_bucket"], f["partition"]["n_bucket"])}
    scan = table.scan(row_filter=EqualTo("user", "ax-0"))
    assert [t.file.partition[0] for t in scan.plan_files()] and {t.file.partition[0] for t in scan.plan_files()} == {user_bucket("ax-0")}
    assert scan.to_arrow().column("n").to_pylist() == [0]


def test_a_request_spark_cannot_run_goes_to_the_dlq_with_a_reason_instead_of_retrying_forever(stack: Stack) -> None:
    # Valid SQL, but size() of a string does not analyse: Spark refuses the job itself.
    create(stack, {"name": "broken", "source": {"http": {"path": "/broken"}},
                   "processors": [{"where": "size(level) > 0"}], "sinks": [{"table": "broken", "auto_create": True}]})
    with stack.client() as http:
        answer = http.post("/broken?wait=true&timeout=90", json=[{"level": "info"}, {"level": "warn"}])
        assert answer.status_code == 200, answer.text
        assert answer.json()["dlq_events"] == 2
        listed = http.get("/v1/dlq", params={"pipeline": "broken"}).json()["entries"]
    assert sorted(orjson.loads(entry["event"])["level"] for entry in listed) == ["info", "warn"], "kept whole, replayable"
    # A plan Spark cannot analyse fails the same way every time: one attempt alone settles it.
    assert all("the Spark job failed with this request alone (1 attempt)" in entry["reason"] for entry in listed)
    assert all(entry["receipt"] == answer.json()["receipt"] for entry in listed)
    assert int(stack.redis.get(keys.backlog_key("demo"))) == 0


def test_expressions_over_fields_a_batch_lacks_read_null(stack: Stack) -> None:
    create(stack, {"name": "sparse", "source": {"http": {"path": "/sparse"}},
                   "processors": [{"where": "http.status >= 500 OR level = 'error'"}],
                   "sinks": [{"table": "${team}_sparse", "auto_create": True}]})
    first = send(stack, "/sparse", [{"level": "error", "team": "a"}, {"level": "info", "team": "a"}])  # no `http` at all
    second = send(stack, "/sparse", [{"level": "error", "http": {"path": "/x"}}])  # `http` without `status`, no `team`
    assert first["tables"] == {"a_sparse": {"rows": 1, "snapshot_id": first["tables"]["a_sparse"]["snapshot_id"]}}
    assert second["dlq_events"] == 1 and "lacks a field" in dlq(stack)[0]["reason"]


def test_a_request_that_breaks_its_batchs_plan_fails_alone(stack_factory) -> None:  # noqa: ANN001
    """`tags` is an array in most requests; one request sends a string, so the batch's inferred type
    is string and `size(tags)` cannot be analysed. The batch is halved until that request is alone:
    every other request is committed, it alone goes to the DLQ."""
    stack = stack_factory(roles=("api", "committer"))
    create(stack, {"name": "tagged", "source": {"http": {"path": "/tagged"}},
                   "processors": [{"where": "size(tags) > 0"}], "sinks": [{"table": "tagged", "auto_create": True}]})
    receipts = {}
    with stack.client() as http:
        for i in range(6):
            event = {"id": i, "tags": "oops" if i == 4 else ["a", "b"]}
            receipts[i] = http.post("/tagged", json=event).json()["receipt"]
    stack.start("writer")  # one batch holds all six requests
    from tests.conftest import wait_until

    with stack.client() as http:
        states = wait_until(
            lambda: (s := {i: http.get(f"/v1/receipts/{r}").json()["status"] for i, r in receipts.items()})
            and all(v in ("committed", "failed") for v in s.values()) and s,
            timeout_s=180, what="every receipt settled",
        )
    assert states == {i: "committed" for i in range(6)}
    assert sorted(r["id"] for r in stack.rows("tagged")) == [0, 1, 2, 3, 5]
    assert [(orjson.loads(r["event"])["id"], r["receipt"]) for r in dlq(stack)] == [(4, receipts[4])]


def test_fields_no_column_takes_are_kept_in_an_extra_fields_column_or_named_in_the_answer_and_counted(stack: Stack) -> None:
    """No field is dropped in silence: a table without schema evolution names, per request, the
    fields it did not take (whether the events were parsed with the table's schema or inferred),
    a processor's `drop` is on purpose and not reported; a sink's extra_fields column (the built-in
    `logs` has one) keeps them instead."""
    create(stack, {
        "name": "declared", "source": {"http": {"path": "/declared"}},
        "sinks": [{"table": "declared", "auto_create": True, "schema": {"columns": [
            {"name": "id", "type": "string", "required": True}, {"name": "n", "type": "long"}]}}],
    })
    create(stack, {
        "name": "trimmed", "source": {"http": {"path": "/trimmed"}}, "processors": [{"drop": ["debug"]}],
        "sinks": [{"table": "trimmed", "auto_create": True, "schema": {"columns": [{"name": "id", "type": "string", "required": True}]}}],
    })
    # The first request creates the table (its events' types are inferred); the next ones are
    # parsed with the table's schema, which never reads the other fields.
    first = send(stack, "/declared", [{"id": "a", "n": 1, "color": "red"}, {"id": "b", "n": 2}])
    assert first["tables"]["declared"]["dropped_fields"] == ["color"]
    later = send(stack, "/declared", [{"id": "c", "zeta": 1, "alpha": {"x": 1}}, {"id": "d", "n": 4, "alpha": None}, {"id": "e"}])
    assert later["tables"]["declared"]["dropped_fields"] == ["alpha", "zeta"]
    clean = send(stack, "/declared", [{"id": "f", "n": 6}])
    assert "dropped_fields" not in clean["tables"]["declared"]
    many = send(stack, "/declared", [{"id": "g", **{f"f{i:02}": i for i in range(30)}}])
    assert many["tables"]["declared"]["dropped_fields"] == [f"f{i:02}" for i in range(20)], "at most 20 names, sorted"
    trimmed = send(stack, "/trimmed", [{"id": "t", "debug": "x", "extra": 1}])
    assert trimmed["tables"]["trimmed"]["dropped_fields"] == ["extra"]
    with stack.client() as http:
        receipt = http.get(f"/v1/receipts/{later['receipt']}").json()
    assert receipt["tables"]["declared"]["dropped_fields"] == ["alpha", "zeta"]
    assert {r["id"]: r["n"] for r in stack.rows("declared")} == {"a": 1, "b": 2, "c": None, "d": 4, "e": None, "f": 6, "g": None}

    # An extra_fields column keeps what no column takes, as JSON text: nothing is dropped. Here
    # the events pass processors, so their types were inferred (the next case: never parsed).
    # Its first version has none: the table is created without the column, which the second adds.
    kept_pipeline = {
        "name": "kept", "source": {"http": {"path": "/kept"}}, "processors": [{"drop": ["debug"]}, {"rename": {"svc": "service"}}],
        "sinks": [{"table": "kept", "auto_create": True, "schema": {"columns": [{"name": "id", "type": "string", "required": True}]}}],
    }
    create(stack, kept_pipeline)
    assert send(stack, "/kept", [{"id": "k0", "x": 0}])["tables"]["kept"]["dropped_fields"] == ["x"]
    kept_pipeline["sinks"][0]["extra_fields"] = "rest"
    with stack.client() as http:
        assert http.put("/v1/pipelines/kept", json=kept_pipeline).status_code == 200
    pause(stack.settings.pipeline_cache_s + 0.5)  # until the writer has the new version
    kept = send(stack, "/kept", [{"id": "k1", "debug": 1, "svc": "a", "n": 2, "tags": [1, 2], "rest": "r", "gone": None}, {"id": "k2"}])
    assert "dropped_fields" not in kept["tables"]["kept"]
    assert {r["id"]: r["rest"] and dict(r["rest"]) for r in stack.rows("kept")} == {
        "k0": None, "k1": {"service": "a", "n": "2", "tags": "[1,2]", "rest": "r"}, "k2": None,
    }

    # The built-in logs pipeline (no evolution) keeps what its table lacks in its _extra column.
    send(stack, "/logs", [{"id": "l1", "msg": "x"}])
    later_logs = send(stack, "/logs", [{"id": "l2", "msg": "y", "user": {"name": "ann"}, "n": 3, "gone": None}, {"only": "new"}])
    assert "dropped_fields" not in later_logs["tables"]["logs"] and later_logs["tables"]["logs"]["rows"] == 2
    assert {r["id"]: (r["msg"], r["_extra"] and dict(r["_extra"])) for r in stack.rows("logs")} == {
        "l1": ("x", None), "l2": ("y", {"user": '{"name":"ann"}', "n": "3"}), None: (None, {"only": "new"}),
    }

    text = stack.metrics()
    assert 'calve_events_with_dropped_fields_total{pipeline="declared",tenant="demo"} 4.0' in text
    # After the first, which made the table, the short way wrote each request, dropping and naming as the full job.
    assert 'calve_direct_batches_total{outcome="written",pipeline="declared",tenant="demo"} 3.0' in text, text
    assert 'calve_events_with_dropped_fields_total{pipeline="trimmed",tenant="demo"} 1.0' in text
    assert 'calve_events_with_dropped_fields_total{pipeline="logs"' not in text
    assert 'calve_events_with_dropped_fields_total{pipeline="kept",tenant="demo"} 1.0' in text, "only before extra_fields"


def test_values_that_cannot_be_converted_are_null_named_in_the_answer_and_counted(stack: Stack) -> None:
    """No value is made NULL in silence: a value an optional column cannot take ("slow" for a
    long, "maybe" for a boolean, "yesterday" for a timestamp) is NULL in its row, as the
    conversion rules say, and the answer and the receipt name the columns, per table; the
    events are counted. Whichever way wrote the request: the full job (the table's first request,
    numbers and text in one column, a time it cannot read) or the short way (a column sent as text)."""
    create(stack, {
        "name": "typed", "source": {"http": {"path": "/typed"}},
        "sinks": [{"table": "typed", "auto_create": True, "schema": {"columns": [
            {"name": "id", "type": "string", "required": True}, {"name": "n", "type": "long"}, {"name": "ok", "type": "boolean"},
            {"name": "at", "type": "timestamptz"}]}}],
    })
    first = send(stack, "/typed", [{"id": "a", "n": "slow", "ok": "maybe"}, {"id": "b", "n": 2, "ok": True}])
    assert first["tables"]["typed"]["nulled_fields"] == ["n", "ok"]
    texts = send(stack, "/typed", [{"id": "c", "n": "n/a", "ok": "no"}, {"id": "d", "n": "12", "ok": "Y"}])
    assert texts["tables"]["typed"]["nulled_fields"] == ["n"]
    assert send(stack, "/typed", [{"id": "e", "at": "yesterday"}])["tables"]["typed"]["nulled_fields"] == ["at"]
    clean = send(stack, "/typed", [{"id": "f", "n": 6, "ok": "yes", "at": "2026-11-29T10:00:00Z"}, {"id": "g", "n": None}])
    assert "nulled_fields" not in clean["tables"]["typed"], "a null or a missing value is no value made NULL"
    with stack.client() as http:
        assert http.get(f"/v1/receipts/{texts['receipt']}").json()["tables"]["typed"]["nulled_fields"] == ["n"]
    assert {r["id"]: (r["n"], r["ok"], r["at"] is not None) for r in stack.rows("typed")} == {
        "a": (None, None, False), "b": (2, True, False), "c": (None, False, False), "d": (12, True, False), "e": (None, None, False),
        "f": (6, True, True), "g": (None, None, False),
    }
    assert 'calve_events_with_nulled_values_total{pipeline="typed",tenant="demo"} 3.0' in stack.metrics()


def test_fields_a_struct_column_lacks_are_kept_under_their_path_or_named_never_lost(stack: Stack) -> None:
    """Inside an object, a field its struct column lacks is kept in the sink's extra_fields map
    under its dotted path (`user.email`), or named in the answer where the sink has none; whether
    the events were parsed with the batch's own types or with the table's schema."""
    columns = [{"name": "id", "type": "string", "required": True}, {"name": "user", "type": "struct<geo: string, name: string>"}]
    create(stack, {"name": "nested", "source": {"http": {"path": "/nested"}},
                   "sinks": [{"table": "nested", "auto_create": True, "extra_fields": "rest", "schema": {"columns": columns}}]})
    # The first request creates the table, its events' types inferred; the second is parsed with
    # the table's schema, which never reads the other fields.
    send(stack, "/nested", [{"id": "n1", "user": {"name": "bob", "email": "bob@example.org"}}])
    send(stack, "/nested", [{"id": "n2", "user": {"name": "ann", "geo": "fr", "email": "ann@example.org", "tags": [1]}, "top": 1},
                            {"id": "n4", "user": {"name": "di", "email": "nested"}, "user.email": "top-level"}])
    create(stack, {"name": "nested_processed", "source": {"http": {"path": "/nested-processed"}}, "processors": [{"where": "id IS NOT NULL"}],
                   "sinks": [{"table": "nested", "extra_fields": "rest"}]})
    send(stack, "/nested-processed", [{"id": "n3", "user": {"name": "cy", "age": 7}}])
    assert {r["id"]: (r["user"], r["rest"] and dict(r["rest"])) for r in stack.rows("nested")} == {
        "n1": ({"geo": None, "name": "bob"}, {"user.email": "bob@example.org"}),
        "n2": ({"geo": "fr", "name": "ann"}, {"user.email": "ann@example.org", "user.tags": "[1]", "top": "1"}),
        "n3": ({"geo": None, "name": "cy"}, {"user.age": "7"}),
        "n4": ({"geo": None, "name": "di"}, {"user.email": "top-level"}),  # a top-level field spelled as the path keeps its value
    }

    create(stack, {"name": "named", "source": {"http": {"path": "/named"}},
                   "sinks": [{"table": "named", "auto_create": True, "schema": {"columns": columns}}]})
    for _ in range(2):  # inferred, then the table's schema
        answer = send(stack, "/named", [{"id": "m", "user": {"name": "bob", "email": "bob@example.org"}}])
        assert answer["tables"]["named"]["dropped_fields"] == ["user.email"], answer


def test_fields_named_with_a_dot_never_become_columns_and_are_kept_in_extra_fields(stack: Stack) -> None:
    """Flattened names (`http.method`, `client.bytes`, as Elastic's common schema and OpenTelemetry
    spell them) in the events a table is created from: Spark would read the dot as a path into a
    struct (the table's creation failed on them, and every request went to the DLQ). They never
    become columns: the built-in `logs` keeps them in its `_extra` map, by the full Spark job (the
    table's first request, and a request it takes again: a number column's text) and by the short
    way alike; a sink without extra_fields names them as dropped."""
    first = send(stack, "/logs", [{"id": "d1", "msg": "x", "http.method": "GET", "client.bytes": 12, "a`b": True}])
    assert first["tables"]["logs"]["rows"] == 1 and "dropped_fields" not in first["tables"]["logs"]
    send(stack, "/logs", [{"id": "d2", "msg": "y", "http.method": "PUT", "client.bytes": 7}])  # the short way
    send(stack, "/logs", [{"id": "d3", "msg": "z", "http.method": "GET"}, {"id": 4, "msg": {"an": "object"}, "client.bytes": 1}])
    table = stack.catalog().load_table(("demo", "logs"))
    assert not [f.name for f in table.schema().fields if "." in f.name or "`" in f.name]
    assert {r["id"]: r["_extra"] and dict(r["_extra"]) for r in stack.rows("logs")} == {
        "d1": {"http.method": "GET", "client.bytes": "12", "a`b": "true"}, "d2": {"http.method": "PUT", "client.bytes": "7"},
        "d3": {"http.method": "GET"}, "4": {"client.bytes": "1"},
    }
    assert not dlq(stack)
    create(stack, {"name": "flat", "source": {"http": {"path": "/flat"}}, "sinks": [{"table": "flat", "auto_create": True}]})
    flat = send(stack, "/flat", [{"id": "f1", "http.method": "GET"}])
    assert flat["tables"]["flat"]["dropped_fields"] == ["http.method"]
    assert stack.rows("flat") == [{"id": "f1"}]
