"""POST /logs to committed Iceberg rows, against the real parts."""

from __future__ import annotations

import gzip
import signal
import time
import uuid

import orjson
import pytest
from sqlmodel import Session

from service.core import keys
from service.core.db import get_engine
from service.tenancy.tenants import issue_token
from tests.conftest import Stack, wait_until

pytestmark = pytest.mark.spark


def ndjson(events: list[dict]) -> bytes:
    return b"\n".join(orjson.dumps(e) for e in events)


def ids_in(stack: Stack) -> list[str]:
    return [row["id"] for row in stack.rows()]


def test_every_body_format_is_committed(stack: Stack) -> None:
    tag = uuid.uuid4().hex[:8]
    sent = {
        "object": [{"id": f"{tag}-obj", "n": 1}],
        "array": [{"id": f"{tag}-arr-{i}", "n": i} for i in range(3)],
        "ndjson": [{"id": f"{tag}-nd-{i}", "n": i} for i in range(4)],
        "gzip": [{"id": f"{tag}-gz-{i}", "n": i} for i in range(5)],
    }
    with stack.client() as http:
        answers = [
            http.post("/logs?wait=true", content=orjson.dumps(sent["object"][0]), headers={"Content-Type": "application/json"}),
            http.post("/logs?wait=true", content=orjson.dumps(sent["array"]), headers={"Content-Type": "application/json"}),
            http.post("/logs?wait=true", content=ndjson(sent["ndjson"]), headers={"Content-Type": "application/x-ndjson"}),
            http.post(
                "/logs?wait=true",
                content=gzip.compress(ndjson(sent["gzip"])),
                headers={"Content-Type": "application/x-ndjson", "Content-Encoding": "gzip"},
            ),
        ]
    for answer, events in zip(answers, sent.values()):
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["status"] == "committed"
        assert body["events"] == len(events)
        assert body["tables"]["logs"]["rows"] == len(events)
    rows = {row["id"]: row["n"] for row in stack.rows()}
    assert rows == {e["id"]: e["n"] for events in sent.values() for e in events}


def test_202_is_buffered_then_committed(stack: Stack) -> None:
    with stack.client() as http:
        answer = http.post("/logs", json={"id": "later", "msg": "hello"})
        assert answer.status_code == 202
        body = answer.json()
        assert body["status"] == "buffered" and body["events"] == 1
        receipt = body["receipt"]
        committed = wait_until(
            lambda: (r := http.get(f"/v1/receipts/{receipt}").json())["status"] == "committed" and r,
            what="receipt to be committed",
        )
    snapshot_id = committed["tables"]["logs"]["snapshot_id"]
    assert ids_in(stack) == ["later"]
    assert int(stack.redis.get(keys.backlog_key("demo"))) == 0, "completing the receipt lowers the backlog"
    table = stack.catalog().load_table(("demo", "logs"))
    assert table.snapshot_by_id(snapshot_id) is not None


def test_wait_true_answers_only_once_rows_are_readable(stack: Stack) -> None:
    with stack.client() as http:
        for round_ in range(3):
            events = [{"id": f"w{round_}-{i}", "round": round_} for i in range(50)]
            answer = http.post("/logs?wait=true", content=ndjson(events), headers={"Content-Type": "application/x-ndjson"})
            assert answer.status_code == 200, answer.text
            # Read straight after the answer: every row of this request must already be there.
            present = set(ids_in(stack))
            assert {e["id"] for e in events} <= present


def test_wait_true_times_out_with_202_while_nothing_commits(stack_factory) -> None:  # noqa: ANN001
    stack = stack_factory(roles=("api",))
    with stack.client() as http:
        answer = http.post("/logs?wait=true&timeout=1", json={"id": "stuck"})
    assert answer.status_code == 202
    assert answer.json()["status"] == "buffered"


def test_missing_and_bad_tokens_get_401_and_nothing_is_buffered(stack_factory) -> None:  # noqa: ANN001
    stack = stack_factory(roles=("api",))
    for token in (None, "calve_not-a-real-token"):
        with stack.client(token) as http:
            answer = http.post("/logs", json={"id": "x"})
            assert answer.status_code == 401
            assert "token" in answer.json()["detail"]
            assert http.get("/v1/tables").status_code == 401
    assert stack.redis.xlen(keys.input_stream_key("demo", "logs")) == 0


def test_malformed_json_is_400_with_the_failing_line_and_nothing_is_buffered(stack_factory) -> None:  # noqa: ANN001
    stack = stack_factory(roles=("api",))
    with stack.client() as http:
        bad = b'{"id": "a"}\n{"id": "b"}\n{"id": "c",\n{"id": "d"}'
        answer = http.post("/logs", content=bad, headers={"Content-Type": "application/x-ndjson"})
        assert answer.status_code == 400
        assert "line 3" in answer.json()["detail"]
        answer = http.post("/logs", content=b'{"id": ', headers={"Content-Type": "application/json"})
        assert answer.status_code == 400
        assert "malformed JSON" in answer.json()["detail"]
    assert stack.redis.xlen(keys.input_stream_key("demo", "logs")) == 0


def test_oversize_body_is_413(stack_factory) -> None:  # noqa: ANN001
    stack = stack_factory(roles=("api",), CALVE_MAX_BODY_BYTES="1000", CALVE_MAX_DECOMPRESSED_BYTES="5000")
    with stack.client() as http:
        answer = http.post("/logs", content=ndjson([{"pad": "x" * 100}] * 20), headers={"Content-Type": "application/x-ndjson"})
        assert answer.status_code == 413
        assert "1000 bytes" in answer.json()["detail"]
        bomb = gzip.compress(b'{"pad":"' + b"x" * 100_000 + b'"}')
        answer = http.post("/logs", content=bomb, headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
        assert answer.status_code == 413
        assert "5000 bytes" in answer.json()["detail"]
    assert stack.redis.xlen(keys.input_stream_key("demo", "logs")) == 0


def test_tables_api_describes_and_previews(stack: Stack) -> None:
    with stack.client() as http:
        assert http.post("/logs?wait=true", json={"id": "t1", "level": "info"}).status_code == 200
        assert http.get("/v1/tables").json() == {"tables": ["_calve_dlq", "logs"]}  # the DLQ is a table of its own
        dlq_table, logs = http.get("/v1/tables", params={"describe": "true"}).json()["described"]
        assert (dlq_table["rows"], dlq_table["data_files"], dlq_table["last_commit_ms"]) == (0, 0, None), "never committed to"
        assert (logs["name"], logs["rows"], logs["data_files"]) == ("logs", 1, 1) and logs["bytes"] > 0 and logs["last_commit_ms"] > 0
        described = http.get("/v1/tables/logs").json()
        assert {f["name"] for f in described["schema"]["fields"]} == {"id", "level", "_extra"}
        summary = described["snapshots"][0]["summary"]
        assert summary[keys.SUMMARY_WATERMARK] and summary[keys.SUMMARY_FENCE]
        assert http.get("/v1/tables/logs/rows?limit=5").json()["rows"] == [{"id": "t1", "level": "info", "_extra": None}]
        body = "\n".join(f'{{"id": "e{i}", "level": "error", "n": {i}}}' for i in range(5))
        assert http.post("/logs?wait=true", content=body, headers={"Content-Type": "application/x-ndjson"}).status_code == 200
        rows = http.get("/v1/tables/logs/rows", params={"filter": "level = 'error' and id in ('e1', 'e3', 't1')"}).json()["rows"]
        assert sorted((row["id"], row["_extra"]) for row in rows) == [("e1", {"n": "1"}), ("e3", {"n": "3"})], "a map is an object"
        assert http.get("/v1/tables/logs/rows", params={"filter": "level = 'debug'"}).json()["rows"] == []
        for bad, says in (("level = ", "at character 1"), ("level = 'x' and", "character"),
                          ("level like '%rror'", "wildcard"), ("_extra is null", "is a map")):
            answer = http.get("/v1/tables/logs/rows", params={"filter": bad})
            assert answer.status_code == 422 and answer.json()["errors"][0]["field"] == "query.filter", answer.text
            assert says in answer.json()["detail"], answer.text
        # A column the table lacks is NULL in every row, as SQL would read it, and the answer says so.
        for missing, ids in (("colour = 'red'", []), ("colour is null and level = 'error'", ["e0", "e1", "e2", "e3", "e4"]),
                             ("not (colour = 'red') or id = 't1'", ["t1"]), ("not (colour is not null or level = 'error')", ["t1"])):
            answer = http.get("/v1/tables/logs/rows", params={"filter": missing}).json()
            assert sorted(row["id"] for row in answer["rows"]) == ids, missing
            assert answer["missing_columns"] == ["colour"] and "its columns are id, level, _extra" in answer["note"]
        assert http.get("/v1/tables/nope").status_code == 404
        assert http.get("/v1/tables/..%2Fetc").status_code in (404, 422)
        assert http.get("/v1/receipts/" + "0" * 32).status_code == 404


def test_readyz_and_metrics(stack: Stack) -> None:
    """/metrics names every tenant and table: an operator token reads it, a tenant's cannot."""
    with Session(get_engine(stack.settings.resolved_database_url())) as session:
        _row, operator = issue_token(session, None, label="prometheus")
    with stack.client() as http:
        assert http.get("/healthz").json() == {"status": "ok"}
        assert http.get("/readyz").status_code == 200
        assert http.post("/logs?wait=true", json={"id": "m"}).status_code == 200
        assert http.get("/metrics").status_code == 403, "a tenant's admin token does not read every tenant's series"
    with stack.client(operator) as http:
        text = http.get("/metrics").text
    assert 'calve_events_received_total{pipeline="logs",tenant="demo"} 1.0' in text
    assert 'calve_stream_backlog{name="logs",stream="input",tenant="demo"} 0.0' in text
    assert 'calve_oldest_waiting_seconds{name="logs",stream="commit",tenant="demo"} 0.0' in text, "nothing waits once committed"
    assert 'calve_backlog_events{tenant="demo"} 0.0' in text
    assert 'calve_accept_to_commit_seconds_count{tenant="demo"} 1.0' in text
    with stack.client(None) as http:
        assert http.get("/v1/tables").status_code == 401
        assert http.post("/logs", json={"id": "x"}, headers={"Authorization": "Bearer calve_not-a-token"}).status_code == 401
        assert http.post("/logs", content=b"{", headers={"Content-Type": "application/json"}).status_code == 401
    with stack.client() as http:
        assert http.post("/logs", content=b"{not json", headers={"Content-Type": "application/json"}).status_code == 400
    with stack.client(operator) as http:
        text = http.get("/metrics").text
    assert 'calve_auth_failures_total{reason="missing"} 2.0' in text
    assert 'calve_auth_failures_total{reason="unknown"} 1.0' in text
    assert 'calve_requests_rejected_total{reason="bad_request_body",tenant="demo"} 1.0' in text
    with stack.client(None) as http:
        assert http.get("/metrics").status_code == 401


def test_readyz_names_what_is_missing(stack_factory) -> None:  # noqa: ANN001
    stack = stack_factory(roles=("api",), CALVE_SPARK_REMOTE="sc://127.0.0.1:1")
    with stack.client(None) as http:
        answer = http.get("/readyz")
    assert answer.status_code == 503
    assert set(answer.json()["missing"]) == {"spark_connect"}


def test_console_page_is_served(stack_factory) -> None:  # noqa: ANN001
    stack = stack_factory(roles=("api",))
    with stack.client(None) as http:
        page = http.get("/", headers={"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"})
        probe = http.get("/", headers={"Accept": "application/vnd.elasticsearch+json; compatible-with=8"})
    assert page.status_code == 200
    assert "Calve console" in page.text and '<script src="/console/console.js"' in page.text
    with stack.client(None) as http:
        script = http.get("/console/console.js")
        assert script.status_code == 200 and "/v1/tables" in script.text
        assert script.headers["content-type"].startswith("text/javascript")
        assert http.get("/console/../service/core/config.py").status_code == 404, "only the console's own files"
        assert http.get("/console/index.py").status_code == 404
    assert probe.headers["x-elastic-product"] == "Elasticsearch", "shippers' probe of an Elasticsearch endpoint"
    assert probe.json()["version"]["number"].startswith("8.")


def test_retried_request_with_idempotency_key_is_committed_once(stack: Stack) -> None:
    events = [{"id": f"idem-{i}"} for i in range(10)]
    headers = {"Idempotency-Key": "batch-0001"}
    with stack.client() as http:
        first = http.post("/logs?wait=true", json=events, headers=headers)
        # The producer lost that answer and retries, twice.
        retries = [http.post("/logs?wait=true", json=events, headers=headers) for _ in range(2)]
    assert first.status_code == 200
    for retry in retries:
        assert retry.status_code == 200
        assert retry.json()["receipt"] == first.json()["receipt"]
        assert retry.json()["tables"] == first.json()["tables"]
    assert sorted(ids_in(stack)) == sorted(e["id"] for e in events)


def test_sigterm_drains_the_api_and_the_committer_commits_what_it_has(stack_factory) -> None:  # noqa: ANN001
    import signal
    import threading

    # Once per minute, never sooner (an idle leader would commit at once): files stay pending.
    stack = stack_factory(CALVE_COMMIT_INTERVAL_S="60", CALVE_COMMIT_MIN_INTERVAL_S="60", CALVE_SHUTDOWN_GRACE_S="30")
    with stack.client() as http:
        assert http.post("/logs?wait=true", json={"id": "first"}).status_code == 200  # first commit: at once
        pending = http.post("/logs", json={"id": "second"}).json()["receipt"]  # next one: 60 s away
        wait_until(lambda: http.get(f"/v1/receipts/{pending}").json()["status"] == "written", what="written")

    answers: dict = {}
    waiting = threading.Thread(
        target=lambda: answers.update(late=stack.client().post("/logs?wait=true&timeout=60", json={"id": "third"}))
    )
    waiting.start()
    wait_until(lambda: stack.redis.xlen(keys.input_stream_key("demo", "logs")) == 0 and
               stack.redis.xlen(keys.commit_stream_key("demo", "logs")) >= 2, what="third written")

    api = stack.procs["api"]
    api.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    with stack.client() as http:
        refused = http.post("/logs", json={"id": "too-late"})
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
        assert http.get("/readyz").status_code == 503
    assert api.poll() is None, "the api waits for the request in flight"

    stack.kill("committer", signal.SIGTERM)  # drains: commits what it leads before exiting
    waiting.join(60)
    assert answers["late"].status_code == 200, answers["late"].text
    # uvicorn re-raises the signal once its shutdown is done, so a clean exit reads as -SIGTERM.
    assert api.wait(30) in (0, -signal.SIGTERM)
    assert sorted(ids_in(stack)) == ["first", "second", "third"]


def test_api_processes_accept_on_one_socket_and_every_request_is_committed(stack_factory) -> None:  # noqa: ANN001
    """CALVE_API_PROCESSES: `calve up` binds the api's socket once and each api process accepts
    connections on it (CALVE_API_SOCKET_FD); every request is committed whichever took it."""
    stack = stack_factory(roles=("writer", "committer"))
    stack.share_api_socket()
    for name in ("api-1", "api-2"):
        stack.start("api", name=name)
    tag = uuid.uuid4().hex[:8]
    for paused, serving in (("api-1", "api-2"), ("api-2", "api-1")):  # a paused process accepts nothing: the other answers all
        stack.procs[paused].send_signal(signal.SIGSTOP)
        try:
            for i in range(3):
                with stack.client() as http:  # a connection of its own
                    assert http.post("/logs", content=ndjson([{"id": f"{tag}-{serving}-{i}"}])).status_code == 202
        finally:
            stack.procs[paused].send_signal(signal.SIGCONT)
    expected = sorted(f"{tag}-{name}-{i}" for name in ("api-1", "api-2") for i in range(3))
    wait_until(lambda: sorted(i for i in ids_in(stack) if i.startswith(tag)) == expected, what="every request committed")
