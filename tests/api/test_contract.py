"""The API is what its OpenAPI document says: schemathesis (stateless, `--checks all`) against a
real api process, its Redis and the session's Spark Connect server; then the contract's pieces a
fuzz reaches only by chance, each on its own."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from google.protobuf import json_format
from sqlmodel import Session

from service.core import keys
from service.core.db import get_engine
from service.tenancy.tenants import get_tenant, issue_token, revoke_token
from tests.conftest import TEST_TOKEN, Stack

CONFIG = Path(__file__).with_name("schemathesis.toml")
# Examples per operation and phase (make test-long's: 40 took 71 s of a worker on a machine whose
# make bench baseline is ~490,000 events/s; 15 took 69 s in a slow phase, so make test runs none).
MAX_EXAMPLES = os.environ.get("CALVE_FUZZ_EXAMPLES", "40")
# Operations that change who may call the API (revoking tokens, disabling tenants) run last, in a
# second pass: a revoked fuzz token would turn the rest of the run into 401s.
LAST = r"^(/v1/tenants.*|/v1/tokens/\{token_id\})$"


def _st(stack: Stack, token: str, *selection: str) -> subprocess.CompletedProcess:
    """One `st run` (its caches under the stack's data directory, not the checkout)."""
    command = [
        str(Path(sys.executable).with_name("st")), "--config-file", str(CONFIG), "run", f"{stack.url}/openapi.json",
        "--checks", "all", "--mode", "all", "--phases", "examples,coverage,fuzzing",
        "--max-examples", MAX_EXAMPLES, "--seed", "20261122", "--workers", "1", "--request-timeout", "30",
        "--no-color", "--output-truncate", "true", "-H", f"Authorization: Bearer {token}", *selection,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=stack.data_dir)


@pytest.mark.spark
@pytest.mark.fuzz
def test_schemathesis_finds_no_answer_the_document_does_not_declare(stack_factory) -> None:  # noqa: ANN001
    # No writers: the fuzz is about the api's answers. wait=true waits at most a second.
    stack = stack_factory(roles=("api",), CALVE_MAX_WAIT_TIMEOUT_S="1")
    with Session(get_engine(stack.settings.resolved_database_url())) as session:
        _row, operator = issue_token(session, None, label="fuzz operator")
    first = _st(stack, TEST_TOKEN, "--exclude-path-regex", LAST)
    second = _st(stack, operator, "--include-path-regex", r"^/v1/tenants")
    third = _st(stack, TEST_TOKEN, "--include-path-regex", r"^/v1/tokens/\{token_id\}$")
    for run in (first, second, third):
        summary = [line.strip() for line in run.stdout.splitlines() if " generated, " in line]
        print(summary[-1] if summary else run.stdout[-2000:])
        assert run.returncode == 0, run.stdout[-20000:] + run.stderr[-2000:]


def _raw(stack: Stack, request: bytes, read_timeout: float = 30) -> bytes:
    with socket.create_connection(("127.0.0.1", stack.port), timeout=read_timeout) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


def test_a_wrong_method_on_a_known_path_is_405_naming_the_right_ones(app_client) -> None:  # noqa: ANN001
    answer = app_client.put("/v1/tokens")
    assert answer.status_code == 405 and answer.headers["allow"] == "GET, POST", answer.text
    assert "use GET, POST" in answer.json()["detail"]
    assert app_client.post("/v1/tables").status_code == 405, "POST on a read-only Calve path is not an ingest"
    assert app_client.get("/no/such/path").status_code == 404


def test_a_typo_in_an_api_path_is_named_as_one_not_as_a_missing_pipeline(app_client) -> None:  # noqa: ANN001
    for path in ("/v1/tables/ext/fiels", "/v1/nope", "/otlp/v1/log", "/loki/api/v1/pushh"):
        answer = app_client.post(path, json={"a": 1})
        assert answer.status_code == 404 and "/docs lists the API's routes" in answer.json()["detail"], (path, answer.text)
    answer = app_client.post("/no_such_pipeline", json={"a": 1})
    assert answer.status_code == 404 and "GET /v1/pipelines lists them" in answer.json()["detail"]


def test_every_error_has_one_shape_with_each_bad_field_named(app_client) -> None:  # noqa: ANN001
    invalid = app_client.get("/v1/tables/logs/rows", params={"limit": 0})
    assert invalid.status_code == 422
    assert isinstance(invalid.json()["detail"], str) and invalid.json()["errors"][0]["field"] == "query.limit"
    assert isinstance(app_client.get("/v1/tables/nope").json()["detail"], str)


def test_a_header_larger_than_the_limit_is_431(stack_factory) -> None:  # noqa: ANN001
    stack = stack_factory(roles=("api",))
    huge = b"X-Padding: " + b"a" * (128 * 1024) + b"\r\n"
    answer = _raw(stack, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + huge + b"\r\n")
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
    assert _raw(stack, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").startswith(b"HTTP/1.1 200")


def test_headers_sent_too_slowly_are_408(stack_factory) -> None:  # noqa: ANN001
    stack = stack_factory(roles=("api",), CALVE_HEADER_TIMEOUT_S="1")
    with socket.create_connection(("127.0.0.1", stack.port), timeout=10) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        for _ in range(4):  # a header line every half second: never done within the deadline
            time.sleep(0.5)
            try:
                sock.sendall(b"X-Slow: 1\r\n")
            except OSError:
                break
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert time.monotonic() - started < 5


def test_a_body_sent_too_slowly_is_408(stack_factory) -> None:  # noqa: ANN001
    stack = stack_factory(roles=("api",), CALVE_BODY_TIMEOUT_S="1")
    head = (
        f"POST /logs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TEST_TOKEN}\r\n"
        "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", stack.port), timeout=10) as sock:
        sock.sendall(head + b'{"msg":')
        time.sleep(2)
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
    assert stack.redis.xlen(keys.input_stream_key("demo", "logs")) == 0, "nothing of it was buffered"


def test_an_oversize_body_from_a_client_that_sends_it_all_first_gets_its_413(stack_factory) -> None:  # noqa: ANN001
    """Python's urllib writes the whole body before it reads: a server that closes without reading
    the rest resets the connection and the client never sees the 413."""
    import urllib.error
    import urllib.request

    stack = stack_factory(roles=("api",))
    body = b'{"msg":"' + b"x" * (11 * 1024 * 1024) + b'"}'
    request = urllib.request.Request(
        f"{stack.url}/logs", data=body, method="POST",
        headers={"Authorization": f"Bearer {TEST_TOKEN}", "Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert refused.value.code == 413
    assert "exceeds the limit" in refused.value.read().decode()


def test_a_body_that_is_not_utf8_gets_an_answer_its_route_declares(app_client) -> None:  # noqa: ANN001
    """Every operation taking a JSON body, sent latin-1 bytes: PATCH /v1/tenants/{name} answered an
    undeclared 400. The operator's token asks the tenant routes, the tenant's the others."""
    from sqlmodel import Session as DbSession

    with DbSession(app_client.app.state.engine) as session:
        _row, operator = issue_token(session, None, label="contract operator")
    document = app_client.get("/openapi.json").json()
    asked = 0
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            if "application/json" not in operation.get("requestBody", {}).get("content", {}):
                continue
            url = path.replace("{name}", "demo" if path.startswith("/v1/tenants") else "logs")
            url = url.replace("{consumer}", "c").replace("{token_id}", "1").replace("{path}", "logs").replace("{index}", "logs")
            headers = {"Content-Type": "application/json"}
            if path.startswith("/v1/tenants"):
                headers["Authorization"] = f"Bearer {operator}"
            answer = app_client.request(method.upper(), url, content='{"name":"caf\u00e9"}'.encode("latin-1"), headers=headers)
            asked += 1
            assert str(answer.status_code) in operation["responses"], (method, path, answer.status_code, answer.text)
            assert answer.status_code < 500 and "detail" in answer.json(), (method, path, answer.text)
    assert asked >= 10


def test_every_table_route_answers_404_for_a_table_that_does_not_exist(app_client) -> None:  # noqa: ANN001
    """GET .../dead-commits of a table that never was answered 200 {"entries": []}."""
    document = app_client.get("/openapi.json").json()
    bodies = {"maintenance": {"tasks": ["compact"], "wait_s": 0}, "consumers": {"name": "c"}, "ack": {"cursor": "snap:1"}}
    asked = 0
    for path, operations in document["paths"].items():
        if not path.startswith("/v1/tables/{name}"):
            continue
        for method in operations:
            url = path.replace("{name}", "never_was").replace("{consumer}", "c").replace("{entry_id}", "1-0")
            answer = app_client.request(method.upper(), url, json=bodies.get(path.rsplit("/", 1)[-1]))
            asked += 1
            assert answer.status_code == 404, (method, path, answer.status_code, answer.text)
    assert asked >= 12


def _ways(stack: Stack, operator: str) -> dict[str, float]:
    """calve_ingest_requests_total by way, from the api's /metrics."""
    with stack.client(operator) as http:
        lines = [line for line in http.get("/metrics").text.splitlines() if line.startswith("calve_ingest_requests_total{")]
    return {line.split('way="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1]) for line in lines}


def test_an_ingest_post_whose_token_and_pipeline_the_api_knows_is_answered_as_the_route_answers_it(stack_factory) -> None:  # noqa: ANN001
    """service/api/fast_ingest.py: once the api has looked up a token and a pipeline, a POST to
    the pipeline's path skips FastAPI's routing. Each request below is sent that way and routed
    (a query parameter the fast way does not read sends it to the route, which ignores it): the
    same status, answer and headers, bad input included; a body too slow is still 408."""
    stack = stack_factory(roles=("api",), CALVE_MAX_EVENTS_PER_REQUEST="5", CALVE_BODY_TIMEOUT_S="1")
    with Session(get_engine(stack.settings.resolved_database_url())) as session:
        _row, operator = issue_token(session, None, label="metrics")
    ndjson = {"Content-Type": "application/x-ndjson"}
    cases = {
        "events": (b'{"a": 1}\n{"b": "x"}', ndjson),
        "one object": (b'{"a": 1}', {"Content-Type": "application/json"}),
        "malformed": (b'{"a": 1}\n{"b": ', ndjson),
        "not objects": (b"[1, 2]", {"Content-Type": "application/json"}),
        "too many": (b"\n".join([b'{"a": 1}'] * 6), ndjson),
        "no such type": (b'{"a": 1}', {"Content-Type": "text/csv"}),
        "not gzip": (b"not gzip", {**ndjson, "Content-Encoding": "gzip"}),
        "empty": (b"", ndjson),
    }

    def answer(response) -> tuple:  # noqa: ANN001
        body = response.json()
        return response.status_code, {k: v for k, v in body.items() if k != "receipt"}, response.headers.get("content-type"), "receipt" in body

    with stack.client() as http:
        assert http.post("/logs", content=b'{"a": 1}', headers=ndjson).status_code == 202  # the token and the pipeline looked up
        before = _ways(stack, operator)
        for name, (body, headers) in cases.items():
            known, routed = http.post("/logs", content=body, headers=headers), http.post("/logs?by=route", content=body, headers=headers)
            assert answer(known) == answer(routed), name
        for way in ("known", "routed"):  # a retry with the same key: the first request's receipt, marked as a replay
            query = "?wait=false" if way == "known" else "?wait=false&by=route"
            first, again = (http.post(f"/logs{query}", content=b'{"a": 1}', headers={**ndjson, "Idempotency-Key": f"k-{way}"}) for _ in range(2))
            assert again.status_code == 202 and again.json()["receipt"] == first.json()["receipt"] and again.headers["idempotent-replay"] == "true", way
        assert http.post("/logs?wait=true&timeout=0.5", content=b'{"a": 1}', headers=ndjson).json()["status"] == "buffered"  # no writer here
        assert http.post("/logs?wait=maybe", content=b'{"a": 1}', headers=ndjson).status_code == 422  # (routed: the route says why)
    after = _ways(stack, operator)
    # (the 422 is FastAPI's, before the route's code)
    assert after["known"] - before.get("known", 0) == len(cases) + 3 and after["routed"] - before["routed"] == len(cases) + 2
    head = (f"POST /logs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TEST_TOKEN}\r\n"
            "Content-Type: application/x-ndjson\r\nContent-Length: 100\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", stack.port), timeout=10) as sock:
        sock.sendall(head + b'{"msg":')
        time.sleep(2)
        slow = sock.recv(65536)
    assert slow.startswith(b"HTTP/1.1 408") and b"did not arrive within" in slow, slow[:300]
    assert _ways(stack, operator)["known"] == after["known"] + 1


def test_a_shippers_post_whose_token_the_api_knows_is_answered_as_the_route_answers_it(stack_factory) -> None:  # noqa: ANN001
    """fast_ingest.py SHIPPERS: an OTLP export, a Loki push or a `_bulk` body whose token the api
    has looked up skips FastAPI's routing, taken by the route's own function. Each request below is sent that
    way and routed (a query parameter the fast way does not read sends it to the route, which
    ignores it): the same status, answer and content type, bad input and a token that may not
    ingest there included; and the metrics count each way."""
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

    stack = stack_factory(roles=("api",), CALVE_WAIT_TIMEOUT_S="0.5")  # (a wait longer than the token's cache time would route the next request)
    with Session(get_engine(stack.settings.resolved_database_url())) as session:
        _row, operator = issue_token(session, None, label="metrics")
        _row, only_logs = issue_token(session, get_tenant(session, "demo"), "ingest", pipelines=["logs"], label="logs only")
    export = {"resourceLogs": [{"scopeLogs": [{"logRecords": [{"timeUnixNano": "1764000000000000000", "body": {"stringValue": "hi"}}]}]}]}
    json_kind, protobuf_kind = {"Content-Type": "application/json"}, {"Content-Type": "application/x-protobuf"}
    ndjson_kind = {"Content-Type": "application/x-ndjson"}
    push = {"streams": [{"stream": {"job": "web"}, "values": [["1764000000000000000", "a line"]]}]}
    cases = {
        "otlp json": ("/otlp/v1/logs", orjson.dumps(export), json_kind),
        "otlp protobuf": ("/otlp/v1/logs", json_format.ParseDict(export, ExportLogsServiceRequest()).SerializeToString(), protobuf_kind),
        "otlp not json": ("/otlp/v1/logs", b'{"resourceLogs": [', json_kind),
        "otlp not protobuf": ("/otlp/v1/logs", b"\xff\xff\xff", protobuf_kind),
        "otlp no such type": ("/otlp/v1/logs", b"{}", {"Content-Type": "text/csv"}),
        "otlp not gzip": ("/otlp/v1/logs", b"not gzip", {**json_kind, "Content-Encoding": "gzip"}),
        "otlp no records": ("/otlp/v1/logs", b'{"resourceLogs": []}', json_kind),
        "loki push": ("/loki/api/v1/push", orjson.dumps(push), json_kind),
        "loki not a push": ("/loki/api/v1/push", b'{"streams": 5}', json_kind),
        # (the first POST of each names a pipeline the api does not keep yet: planned where the DB is read)
        "bulk": ("/_bulk", b'{"index":{"_index":"logs"}}\n{"a":1}\n{"index":{"_index":"logs"}}\n{"b":"x"}\n', ndjson_kind),
        "bulk no such index": ("/_bulk", b'{"create":{"_index":"nope","_id":"7"}}\n{"a":1}\n', ndjson_kind),
        "bulk items each": ("/_bulk", b'{"index":{"_index":"logs","_id":"1"}}\n{"a":1}\n{"delete":{"_index":"logs","_id":"2"}}\n', ndjson_kind),
        "bulk not json": ("/_bulk", b'{"index":\n{"a":1}\n', ndjson_kind),
    }

    def answer(response) -> tuple:  # noqa: ANN001
        content = response.content
        if response.request.url.path == "/_bulk" and response.status_code == 200:  # its time taken and made-up _ids aside
            content = orjson.loads(content) | {"took": 0}
            for item in content["items"]:
                made = next(iter(item.values()))
                if re.fullmatch("[0-9a-f]{32}", made["_id"]):  # (an _id the request gave is compared)
                    made["_id"] = "made up"
        return response.status_code, content, response.headers.get("content-type")

    with stack.client() as http:
        assert http.post("/logs", content=b'{"a": 1}', headers={"Content-Type": "application/x-ndjson"}).status_code == 202  # the token looked up
        before = _ways(stack, operator)
        for name, (path, body, headers) in cases.items():
            known, routed = http.post(path, content=body, headers=headers), http.post(f"{path}?by=route", content=body, headers=headers)
            assert answer(known) == answer(routed), name
            if name.startswith("bulk") and known.status_code == 200:
                assert [next(iter(item.values()))["status"] for item in known.json()["items"]] == {
                    "bulk": [201, 201], "bulk no such index": [404], "bulk items each": [201, 400]}[name], known.text
            assert known.status_code == {"otlp json": 200, "otlp protobuf": 200, "otlp no records": 200, "loki push": 204,
                                         "bulk": 200, "bulk no such index": 200, "bulk items each": 200}.get(name, 400), (name, known.text)
        for query in ("?wait=true", "?wait=true&timeout=60"):  # no writer here: buffered only (the route has no timeout)
            waited = http.post(f"/otlp/v1/logs{query}", content=orjson.dumps(export), headers=json_kind)
            assert waited.status_code == 200 and "not yet committed" in waited.json()["partialSuccess"]["errorMessage"], waited.text
    with stack.client(only_logs) as http:
        assert http.post("/logs", content=b'{"a": 1}', headers={"Content-Type": "application/x-ndjson"}).status_code == 202  # looked up
        known, routed = (http.post(f"/otlp/v1/logs{query}", content=orjson.dumps(export), headers=json_kind) for query in ("", "?by=route"))
        assert answer(known) == answer(routed) and known.status_code == 403, known.text
    after = _ways(stack, operator)
    # (the last token's first POST to /logs was routed: looked up)
    assert after["known"] - before.get("known", 0) == len(cases) + 3 and after["routed"] - before["routed"] == len(cases) + 2, (before, after)


def test_a_token_and_a_pipeline_in_use_are_looked_up_again_before_they_expire_and_a_revocation_still_ends_the_token(stack_factory) -> None:  # noqa: ANN001
    """fast_ingest.py with RefreshAhead: a token and a pipeline the api keeps are looked up again
    in the background past half their time, so requests sent steadily never find them expired
    and none takes the route's way (which waits on the lookup); a token revoked where no api hears
    of it (straight in the DB) is still refused within its cache's time, the lookup ahead finding
    it gone."""
    stack = stack_factory(roles=("api",), CALVE_AUTH_CACHE_S="1", CALVE_PIPELINE_CACHE_S="0.6")
    engine = get_engine(stack.settings.resolved_database_url())
    with Session(engine) as session:
        _row, operator = issue_token(session, None, label="metrics")
        row, other = issue_token(session, get_tenant(session, "demo"), "ingest", label="revoked unheard")
    ndjson = {"Content-Type": "application/x-ndjson"}
    with stack.client() as http:
        assert http.post("/logs", content=b'{"a": 1}', headers=ndjson).status_code == 202  # the token and the pipeline looked up
        before = _ways(stack, operator)
        deadline = time.monotonic() + 4  # past six of the pipeline's times and four of the token's
        sent = 0
        while time.monotonic() < deadline:
            assert http.post("/logs", content=b'{"a": 1}', headers=ndjson).status_code == 202
            sent += 1
            time.sleep(0.05)
    after = _ways(stack, operator)
    assert after["known"] - before.get("known", 0) == sent and after["routed"] == before["routed"], (before, after)
    with stack.client(other) as http:
        assert http.post("/logs", content=b'{"a": 1}', headers=ndjson).status_code == 202
        with Session(engine) as session:
            revoke_token(session, get_tenant(session, "demo"), row.id)  # (not announced: no api clears its cache)
        deadline = time.monotonic() + 1.5  # the token's time, and its lookup
        while (status := http.post("/logs", content=b'{"a": 1}', headers=ndjson).status_code) == 202 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert status == 401
