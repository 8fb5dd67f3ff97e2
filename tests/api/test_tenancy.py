"""Tenants, tokens, limits and hostile input, through the api (real Redis, real metadata DBs)."""

from __future__ import annotations

import gzip
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import text
from sqlmodel import Session

from service.cli.processes import free_port
from service.core import keys
from service.core.db import get_engine
from service.iceberg.catalog import create_table_once
from service.tenancy.tenants import issue_token
from tests.conftest import TEST_TOKEN, Stack

# Behaviour that does not depend on the metadata DB runs on SQLite only; what stores or reads
# tokens and tenants (401s, revocation by the CLI, disabling, tokens kept hashed) runs on both.
SQLITE_ONLY = pytest.mark.parametrize("metadata_url", ["sqlite"], indirect=True)


@pytest.fixture
def api(stack_factory, metadata_url: str) -> Stack:  # noqa: ANN001
    """An api (no writer) on each metadata backend, with an operator token and tenant `beta`."""
    stack = stack_factory(roles=("api",), CALVE_DATABASE_URL=metadata_url)
    with Session(get_engine(metadata_url)) as session:
        _row, stack.operator = issue_token(session, None, label="test operator")
    with stack.client(stack.operator) as http:
        created = http.post("/v1/tenants", json={"name": "beta"})
        assert created.status_code == 201, created.text
        stack.beta = created.json()["admin_token"]
    return stack


def mint(stack: Stack, admin_token: str, **body) -> tuple[int, str]:  # noqa: ANN003
    with stack.client(admin_token) as http:
        answer = http.post("/v1/tokens", json=body)
    assert answer.status_code == 201, answer.text
    return answer.json()["id"], answer.json()["token"]


def tenant_routes(receipt: str, token_id: int) -> list[tuple[str, str, dict | None]]:
    """Every route that touches a tenant's things, with what it needs to run."""
    return [
        ("POST", "/logs", {"id": "x"}),
        ("GET", f"/v1/receipts/{receipt}", None),
        ("GET", "/v1/tables", None),
        ("GET", "/v1/tables/logs", None),
        ("GET", "/v1/tables/logs/rows", None),
        ("GET", "/v1/tokens", None),
        ("POST", "/v1/tokens", {"scopes": ["read"]}),
        ("DELETE", f"/v1/tokens/{token_id}", None),
    ]


OPERATOR_ROUTES = [
    ("GET", "/v1/tenants", None),
    ("POST", "/v1/tenants", {"name": "gamma"}),
    ("POST", "/v1/tenants/beta/disable", None),
    ("POST", "/v1/tenants/beta/enable", None),
    ("GET", "/v1/tenants/beta/landing-prefixes", None),
    ("PUT", "/v1/tenants/beta/landing-prefixes", {"prefixes": []}),
]


def call(stack: Stack, token: str | None, method: str, path: str, body: dict | None, port: int | None = None):  # noqa: ANN201
    with stack.client(token, port=port) as http:
        return http.request(method, path, json=body)


def demo_things(stack: Stack) -> tuple[str, int]:
    """Tenant demo's receipt, table and a spare token, for others to reach for."""
    with stack.client() as http:
        receipt = http.post("/logs", json={"id": "demo-secret"}).json()["receipt"]
    create_table_once(stack.catalog(), "demo", "logs", pa.schema([("id", pa.string())]))
    token_id, _ = mint(stack, TEST_TOKEN, scopes=["read"])
    return receipt, token_id


@SQLITE_ONLY
def test_another_tenants_things_are_404_on_every_route(api: Stack) -> None:
    receipt, token_id = demo_things(api)
    for method, path, body in tenant_routes(receipt, token_id):
        if method == "POST":
            continue  # creating goes to the caller's own tenant; checked below
        answer = call(api, api.beta, method, path, body)
        if path in ("/v1/tables", "/v1/tokens"):
            assert answer.status_code == 200
            assert "logs" not in answer.json().get("tables", []), "beta sees demo's table"
            assert token_id not in [t["id"] for t in answer.json().get("tokens", [])], "beta sees demo's token"
        else:
            assert answer.status_code == 404, f"{method} {path}: {answer.status_code} {answer.text}"
    # What beta writes lands in beta's own namespace and receipts.
    with api.client(api.beta) as http:
        beta_receipt = http.post("/logs", json={"id": "beta"}).json()["receipt"]
    assert call(api, TEST_TOKEN, "GET", f"/v1/receipts/{beta_receipt}", None).status_code == 404
    assert api.redis.xlen(keys.input_stream_key("beta", "logs")) == 1


def test_expired_revoked_and_unknown_tokens_are_401_everywhere(api: Stack) -> None:
    receipt, token_id = demo_things(api)
    _id, expiring = mint(api, TEST_TOKEN, scopes=["ingest", "read", "admin"], expires_in_s=1)
    revoked_id, revoked = mint(api, TEST_TOKEN, scopes=["ingest", "read", "admin"])
    assert call(api, expiring, "GET", "/v1/tables", None).status_code == 200  # now cached
    assert call(api, revoked, "GET", "/v1/tables", None).status_code == 200
    assert call(api, TEST_TOKEN, "DELETE", f"/v1/tokens/{revoked_id}", None).status_code == 200
    time.sleep(1.2)
    for token in (expiring, revoked, "calve_unknown", None):
        for method, path, body in tenant_routes(receipt, token_id) + OPERATOR_ROUTES:
            answer = call(api, token, method, path, body)
            assert answer.status_code == 401, f"{method} {path} with {str(token)[:12]}: {answer.status_code}"


@SQLITE_ONLY
def test_wrong_scope_is_403_on_every_route(api: Stack) -> None:
    receipt, token_id = demo_things(api)
    _i, ingest_only = mint(api, TEST_TOKEN, scopes=["ingest"])
    _i, read_only = mint(api, TEST_TOKEN, scopes=["read"])
    needs = {"/logs": "ingest", "/v1/receipts": "read", "/v1/tables": "read", "/v1/tokens": "admin"}
    for method, path, body in tenant_routes(receipt, token_id):
        scope = next(v for k, v in needs.items() if path.startswith(k))
        for token, holds in ((ingest_only, "ingest"), (read_only, "read")):
            answer = call(api, token, method, path, body)
            if holds == scope:
                assert answer.status_code < 400, f"{method} {path}: {answer.text}"
            else:
                assert answer.status_code == 403, f"{method} {path} with {holds}: {answer.status_code}"
                assert scope in answer.json()["detail"]
        assert call(api, api.operator, method, path, body).status_code == 403, "operator on a tenant route"
    for method, path, body in OPERATOR_ROUTES:
        assert call(api, TEST_TOKEN, method, path, body).status_code == 403, "tenant admin on an operator route"


@SQLITE_ONLY
def test_ingest_token_limited_to_pipelines(api: Stack) -> None:
    _i, other_pipeline = mint(api, TEST_TOKEN, scopes=["ingest"], pipelines=["audit"])
    answer = call(api, other_pipeline, "POST", "/logs", {"id": 1})
    assert answer.status_code == 403 and "audit" in answer.json()["detail"]
    _i, logs_only = mint(api, TEST_TOKEN, scopes=["ingest"], pipelines=["logs"])
    assert call(api, logs_only, "POST", "/logs", {"id": 1}).status_code == 202


@SQLITE_ONLY
def test_revocation_holds_at_once_on_every_replica(api: Stack) -> None:
    second = free_port()
    api.start("api", name="api-2", port=second)
    token_id, token = mint(api, TEST_TOKEN, scopes=["read"])
    assert call(api, token, "GET", "/v1/tables", None, port=second).status_code == 200  # cached there
    assert call(api, TEST_TOKEN, "DELETE", f"/v1/tokens/{token_id}", None).status_code == 200
    time.sleep(0.2)  # pub/sub delivery, far below the 5 s cache period
    assert call(api, token, "GET", "/v1/tables", None, port=second).status_code == 401


def test_cli_revocation_reaches_the_running_api(api: Stack) -> None:
    token_id, token = mint(api, TEST_TOKEN, scopes=["read"])
    assert call(api, token, "GET", "/v1/tables", None).status_code == 200
    subprocess.run(
        [sys.executable, "-m", "service.cli", "token", "revoke", str(token_id), "--tenant", "demo"],
        env=api.env, check=True, capture_output=True,
    )
    time.sleep(0.2)
    assert call(api, token, "GET", "/v1/tables", None).status_code == 401


def test_disabled_tenant_is_refused_and_last_use_is_recorded(api: Stack) -> None:
    assert call(api, api.beta, "GET", "/v1/tables", None).status_code == 200
    listed = call(api, api.beta, "GET", "/v1/tokens", None).json()["tokens"]
    assert listed[0]["last_used_at"] is not None
    assert "token" not in listed[0] and listed[0]["prefix"] == api.beta[:10]
    assert call(api, api.operator, "POST", "/v1/tenants/beta/disable", None).status_code == 200
    time.sleep(0.2)
    assert call(api, api.beta, "GET", "/v1/tables", None).status_code == 401
    assert call(api, TEST_TOKEN, "GET", "/v1/tables", None).status_code == 200, "other tenants unaffected"


@SQLITE_ONLY
def test_hostile_names_get_422(api: Stack) -> None:
    for name in ["../etc", "A", "a.b", "a/b", "x" * 64, "{demo}"]:
        answer = call(api, api.operator, "POST", "/v1/tenants", {"name": name})
        assert answer.status_code == 422 and "invalid tenant name" in answer.json()["detail"], name
        answer = call(api, TEST_TOKEN, "POST", "/v1/tokens", {"scopes": ["ingest"], "pipelines": [name]})
        assert answer.status_code == 422 and "invalid pipeline name" in answer.json()["detail"], name


@SQLITE_ONLY
def test_rate_limit_is_429_with_retry_after_and_shared(api: Stack) -> None:
    with api.client(api.operator) as http:
        tight = http.post("/v1/tenants", json={"name": "tight", "max_events_per_s": 50}).json()["admin_token"]
    events = [{"n": i} for i in range(60)]
    assert call(api, tight, "POST", "/logs", events).status_code == 202  # burst: 2 s = 100 events
    answer = call(api, tight, "POST", "/logs", events)
    assert answer.status_code == 429
    assert int(answer.headers["Retry-After"]) >= 1
    assert "50 events/s" in answer.json()["detail"]
    too_big = call(api, tight, "POST", "/logs", [{"n": i} for i in range(150)])
    assert too_big.status_code == 413 and "burst of 100 events" in too_big.json()["detail"]
    assert call(api, TEST_TOKEN, "POST", "/logs", events).status_code == 202, "other tenants unaffected"
    time.sleep(int(answer.headers["Retry-After"]))
    assert call(api, tight, "POST", "/logs", events).status_code == 202, "allowed again after Retry-After"


@SQLITE_ONLY
def test_backlog_cap_is_503_for_that_tenant_only(api: Stack) -> None:
    with api.client(api.operator) as http:
        small = http.post("/v1/tenants", json={"name": "small", "max_backlog_events": 100}).json()["admin_token"]
    events = [{"n": i} for i in range(60)]
    assert call(api, small, "POST", "/logs", events).status_code == 202
    assert call(api, small, "POST", "/logs", events).status_code == 202  # 120 waiting now
    answer = call(api, small, "POST", "/logs", events)
    assert answer.status_code == 503 and answer.headers["Retry-After"] == "5"
    assert "accepted but not yet committed" in answer.json()["detail"]
    assert call(api, TEST_TOKEN, "POST", "/logs", events).status_code == 202, "other tenants keep flowing"
    assert int(api.redis.get(keys.backlog_key("small"))) == 120


@SQLITE_ONLY
def test_a_request_over_its_limits_buffers_and_charges_nothing_and_a_retry_of_an_accepted_one_is_answered(api: Stack) -> None:
    """Limits, idempotency and buffering are one step: a refused request claims no idempotency key
    and takes no tokens; a retry of an accepted request gets its receipt even over the limits."""
    with api.client(api.operator) as http:
        strict = http.post("/v1/tenants", json={"name": "strict", "max_events_per_s": 50, "max_backlog_events": 100}).json()["admin_token"]
    events = [{"n": i} for i in range(60)]

    def post(key: str) -> httpx.Response:
        with api.client(strict) as http:
            return http.post("/logs", json=events, headers={"Idempotency-Key": key})

    first = post("a")
    assert first.status_code == 202
    over_rate = post("b")  # 60 of the burst's 100 events are gone
    assert over_rate.status_code == 429, over_rate.text
    replay = post("a")
    assert replay.status_code == 202 and replay.json()["receipt"] == first.json()["receipt"]
    assert replay.headers["Idempotent-Replay"] == "true"
    assert api.redis.xlen(keys.input_stream_key("strict", "logs")) == 1
    time.sleep(int(over_rate.headers["Retry-After"]) + 0.5)
    retried = post("b")
    assert retried.status_code == 202 and "Idempotent-Replay" not in retried.headers, "the refused request kept no key"
    tokens = api.redis.hget(keys.rate_key("strict", "events"), "tokens")
    over_backlog = post("c")  # 120 waiting: the cap is reached
    assert over_backlog.status_code == 503, over_backlog.text
    assert api.redis.hget(keys.rate_key("strict", "events"), "tokens") == tokens, "a request refused for the backlog takes no tokens"
    assert api.redis.xlen(keys.input_stream_key("strict", "logs")) == 2
    assert int(api.redis.get(keys.backlog_key("strict"))) == 120


@SQLITE_ONLY
def test_a_tenant_refused_moments_ago_is_refused_before_its_bodies_are_read_but_only_when_reading_them_would_refuse(api: Stack) -> None:
    """After a refusal, the tenant's requests are looked at before they are parsed. A body over the
    limits is refused unread: 19 malformed lines each ending an object are 19 events at least, so a
    429 (or the backlog's 503), where reading would have found them malformed (400). A body that
    fits, and a retry of an accepted request, get what they got before; other tenants' bodies are
    read as ever. (19 events of a burst of 20: the malformed body stays over the rate until 1.8 s
    after the first, time enough on a slow machine.)"""
    with api.client(api.operator) as http:
        tight = http.post("/v1/tenants", json={"name": "tight", "max_events_per_s": 10}).json()["admin_token"]  # burst: 20
        full = http.post("/v1/tenants", json={"name": "full", "max_backlog_events": 20}).json()["admin_token"]
    lines = b"".join(b'{"n":%d}\n' % i for i in range(19))
    malformed = b"".join(b'{"n":%d,}\n' % i for i in range(19))

    def post(token: str, body: bytes, key: str | None = None) -> httpx.Response:
        headers = {"Content-Type": "application/x-ndjson", **({"Idempotency-Key": key} if key else {})}
        with api.client(token) as http:
            return http.post("/logs", content=body, headers=headers)

    first = post(tight, lines, "a")
    assert first.status_code == 202, first.text
    assert post(tight, lines, "b").status_code == 429  # 1 token left
    replay = post(tight, lines, "a")
    assert replay.status_code == 202 and replay.json()["receipt"] == first.json()["receipt"], replay.text
    unread = post(tight, malformed)
    assert unread.status_code == 429 and int(unread.headers["Retry-After"]) >= 1, unread.text
    assert "10 events/s" in unread.json()["detail"]
    assert post(tight, b'{"n":1}\n').status_code == 202, "a body within the tokens left gets through"
    assert post(TEST_TOKEN, malformed).status_code == 400, "another tenant's body is read"

    assert post(full, lines).status_code == 202 and post(full, lines).status_code == 202  # 38 waiting
    assert post(full, lines).status_code == 503
    unread = post(full, malformed)
    assert unread.status_code == 503 and unread.headers["Retry-After"] == "5", unread.text
    with api.client(full) as http:  # the shippers' bodies too (read: Loki's a 400, _bulk's a 200 with its item refused)
        loki = http.post("/loki/api/v1/push", content=b'{"streams": [', headers={"Content-Type": "application/json"})
        bulk = http.post("/_bulk", content=b'{"index": {"_index": "logs"}}\n{"n": \n', headers={"Content-Type": "application/x-ndjson"})
    assert loki.status_code == 503 and bulk.status_code == 503, (loki.text, bulk.text)
    with api.client(TEST_TOKEN) as http:
        assert http.post("/loki/api/v1/push", content=b'{"streams": [', headers={"Content-Type": "application/json"}).status_code == 400
    assert api.redis.xlen(keys.input_stream_key("tight", "logs")) == 2
    assert int(api.redis.get(keys.backlog_key("full"))) == 38


@SQLITE_ONLY
def test_an_operator_changes_a_tenants_limits_and_sees_its_backlog(api: Stack) -> None:
    """A tighter backlog cap applies to the next request, null sets it back to the default; the
    tenants list shows each tenant's backlog (no writer runs here: nothing is committed)."""
    events = [{"n": i} for i in range(30)]
    assert call(api, api.beta, "POST", "/logs", events).status_code == 202
    with api.client(api.operator) as http:
        listed = {t["name"]: t for t in http.get("/v1/tenants").json()["tenants"]}
        assert listed["beta"]["backlog_events"] == 30 and listed["demo"]["backlog_events"] == 0
        assert listed["beta"]["received_events"] == 30 and listed["beta"]["committed_events"] == 0
        # A request is refused once the backlog has reached the cap: beta's 30 reach 30.
        changed = http.patch("/v1/tenants/beta", json={"max_backlog_events": 30, "max_events_per_s": 1000})
        assert changed.status_code == 200 and changed.json()["max_backlog_events"] == 30, changed.text
        assert http.patch("/v1/tenants/nobody", json={"max_backlog_events": 40}).status_code == 404
        assert http.patch("/v1/tenants/beta", json={"max_backlog_events": 0}).status_code == 422
        assert http.patch("/v1/tenants/beta", json={"max_backlog_events": "40"}).status_code == 422
        assert http.patch("/v1/tenants/beta", json={"max_bytes_per_s": 5e6}).json()["max_bytes_per_s"] == 5_000_000, "JSON's 5e6 is an integer"
    assert call(api, api.beta, "POST", "/logs", events).status_code == 503, "the new cap applies at once"
    assert call(api, api.beta, "PATCH", "/v1/tenants/beta", {"max_backlog_events": None}).status_code == 403, "operators only"
    with api.client(api.operator) as http:
        reset = http.patch("/v1/tenants/beta", json={"max_backlog_events": None}).json()
    assert reset["max_backlog_events"] is None and reset["max_events_per_s"] == 1000, "only the limits given change"
    assert call(api, api.beta, "POST", "/logs", events).status_code == 202, "back to the default cap"


def test_an_operator_grants_and_takes_back_landing_prefixes_through_the_api(api: Stack, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A grant applies to the tenant's next registration without a restart; a prefix that
    overlaps another tenant's (either way) is 409, one inside the warehouse or not a full URI 422;
    another tenant still cannot register the granted files; an empty list takes the grant back."""
    landing = tmp_path_factory.mktemp("landing")
    (landing / "beta").mkdir()
    schema = pa.schema([("user", pa.string())])
    create_table_once(api.catalog(), "beta", "events", schema)
    demo_table = create_table_once(api.catalog(), "demo", "events", schema)
    landed = landing / "beta" / "a.parquet"
    pq.write_table(pa.table({"user": ["x"]}, schema=schema), landed)

    def register(token: str) -> dict:
        answer = call(api, token, "POST", "/v1/tables/events/files", {"files": [{"path": landed.as_uri()}]})
        return {"code": answer.status_code, **answer.json()}

    assert register(api.beta)["files"][0]["reason"] == "location", "nothing granted yet"
    granted = [(landing / "beta").as_uri() + "/"]
    with api.client(api.operator) as http:
        answer = http.put("/v1/tenants/beta/landing-prefixes", json={"prefixes": [(landing / "beta").as_uri(), granted[0]]})
        assert answer.status_code == 200 and answer.json()["granted"] == granted, answer.text
        assert http.get("/v1/tenants/beta/landing-prefixes").json() == {"tenant": "beta", "granted": granted, "configured": []}
        for overlapping in (landing.as_uri(), (landing / "beta" / "sub").as_uri(), granted[0]):
            answer = http.put("/v1/tenants/demo/landing-prefixes", json={"prefixes": [overlapping]})
            assert answer.status_code == 409 and "'beta'" in answer.json()["detail"], answer.text
        for refused in (f"{demo_table.location()}/data/landing", "landing/beta", "s3://bucket", f"{granted[0]}../x"):
            assert http.put("/v1/tenants/demo/landing-prefixes", json={"prefixes": [refused]}).status_code == 422, refused
        assert http.put("/v1/tenants/nobody/landing-prefixes", json={"prefixes": []}).status_code == 404
        assert http.get("/v1/tenants/demo/landing-prefixes").json()["granted"] == [], "nothing refused was granted"
    assert call(api, api.beta, "PUT", "/v1/tenants/beta/landing-prefixes", {"prefixes": []}).status_code == 403, "operators only"
    accepted = register(api.beta)
    assert (accepted["code"], accepted["accepted"]) == (202, 1), accepted
    assert register(TEST_TOKEN)["files"][0]["reason"] == "location", "another tenant's table cannot take the granted files"
    with api.client(api.operator) as http:
        assert http.put("/v1/tenants/beta/landing-prefixes", json={"prefixes": []}).json()["granted"] == []
    assert register(api.beta)["files"][0]["reason"] == "location", "taken back at once"


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@SQLITE_ONLY
def test_gzip_bomb_and_oversize_stream_keep_the_api_memory_bounded(api: Stack) -> None:
    pid = api.procs["api"].pid
    call(api, TEST_TOKEN, "POST", "/logs", {"warm": 1})
    before = rss_kib(pid)
    bomb = gzip.compress(b"\n".join([b'{"pad":"' + b"0" * 1000 + b'"}'] * 1_000_000), compresslevel=9)  # ~1 GB inflated
    assert len(bomb) < 10 * 1024 * 1024
    headers = {"Content-Type": "application/x-ndjson", "Content-Encoding": "gzip"}
    with api.client() as http:
        for _ in range(3):
            answer = http.post("/logs", content=bomb, headers=headers)
            assert answer.status_code == 413 and "decompressed body exceeds" in answer.json()["detail"]

        def endless():  # noqa: ANN202 - chunked, no Content-Length: only the streaming check can stop it
            line = b'{"pad":"' + b"x" * 1000 + b'"}\n'
            for _ in range(40_000):  # ~40 MB offered
                yield line * 16

        answer = http.post("/logs", content=endless(), headers={"Content-Type": "application/x-ndjson"})
        assert answer.status_code == 413
    grown_mib = (rss_kib(pid) - before) / 1024
    assert grown_mib < 64, f"api RSS grew by {grown_mib:.0f} MiB"
    assert api.redis.xlen(keys.input_stream_key("demo", "logs")) == 1


def test_raw_tokens_appear_in_no_log_and_nowhere_in_the_database(api: Stack, metadata_url: str) -> None:
    _id, token = mint(api, TEST_TOKEN, scopes=["ingest", "read"])
    assert call(api, token, "POST", "/logs", {"n": 1}).status_code == 202
    assert call(api, token + "x", "GET", "/v1/tables", None).status_code == 401
    with get_engine(metadata_url).connect() as connection:
        for table in ("token", "tenant"):
            rows = connection.execute(text(f"SELECT * FROM {table}")).all()
            assert rows and token not in repr(rows), f"raw token stored in {table}"
    for path in api.data_dir.rglob("*"):
        if path.is_file() and path.suffix in (".log", ".db", ".db-wal", "") and path.stat().st_size < 50 * 2**20:
            assert token.encode() not in path.read_bytes(), f"raw token found in {path}"


@SQLITE_ONLY
def test_idempotency_key_ingests_once_per_tenant(api: Stack) -> None:
    events = [{"n": i} for i in range(3)]
    headers = {"Idempotency-Key": "order-42 retry-safe"}
    with api.client() as http:
        first = http.post("/logs", json=events, headers=headers)
        again = http.post("/logs", json=events, headers=headers)
        other_key = http.post("/logs", json=events, headers={"Idempotency-Key": "order-43"})
        assert http.post("/logs", json=events, headers={"Idempotency-Key": "x" * 256}).status_code == 400
    with api.client(api.beta) as http:
        beta = http.post("/logs", json=events, headers=headers)
    assert first.status_code == again.status_code == 202
    assert again.json()["receipt"] == first.json()["receipt"] and again.headers["Idempotent-Replay"] == "true"
    assert "Idempotent-Replay" not in first.headers
    assert other_key.json()["receipt"] != first.json()["receipt"]
    assert beta.json()["receipt"] != first.json()["receipt"], "keys are per tenant"
    assert api.redis.xlen(keys.input_stream_key("demo", "logs")) == 2
    assert int(api.redis.get(keys.backlog_key("demo"))) == 6


@SQLITE_ONLY
def test_a_receipt_is_kept_as_long_as_a_retry_may_name_it_and_no_longer(api: Stack) -> None:
    """A receipt costs Redis ~330 bytes for as long as it is kept (README "Configuration"): by
    default a day, the idempotency window, not a week; the 404 past it says how long."""
    with api.client() as http:
        receipt = http.post("/logs", json={"n": 1}, headers={"Idempotency-Key": "kept"}).json()["receipt"]
        gone = http.get(f"/v1/receipts/{'0' * 32}")
    kept = api.redis.ttl(keys.receipt_key("demo", receipt))
    window = max(api.redis.ttl(key) for key in api.redis.scan_iter(keys.idempotency_key("demo", "*")))
    assert 86_000 < kept <= 86_400 and abs(kept - window) <= 5
    assert gone.status_code == 404 and "receipts are kept 1 day)" in gone.json()["detail"]


@SQLITE_ONLY
def test_concurrent_retries_with_one_key_buffer_once(api: Stack) -> None:
    import concurrent.futures

    def send(_i: int) -> str:
        with api.client() as http:
            return http.post("/logs", json={"n": 1}, headers={"Idempotency-Key": "same"}).json()["receipt"]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        receipts = set(pool.map(send, range(16)))
    assert len(receipts) == 1
    assert api.redis.xlen(keys.input_stream_key("demo", "logs")) == 1


@SQLITE_ONLY
def test_hostile_numbers_depths_and_definitions_get_a_4xx_never_a_500(api: Stack) -> None:
    """Each of these answered 500 once (an integer past 64 bits reaching the DB, a recursion limit)."""
    huge = 9223372036854775808
    deep_where = "(" * 60 + "a = 1" + ")" * 60
    deep_yaml = "name: " + "[" * 400 + "]" * 400
    base = {"name": "hostile", "source": {"http": {"path": "/hostile"}}, "sinks": [{"table": "hostile", "auto_create": True}]}
    with api.client() as http:
        assert http.delete(f"/v1/tokens/{huge}").status_code == 422
        assert http.get(f"/v1/pipelines/logs?version={huge}").status_code == 422
        for lifetime in (315360000000, 99999999999999999, True):
            assert http.post("/v1/tokens", json={"expires_in_s": lifetime}).status_code == 422, lifetime
        assert http.post("/v1/pipelines", content=deep_yaml, headers={"Content-Type": "application/yaml"}).status_code == 400
        refused = http.post("/v1/pipelines", json=base | {"processors": [{"where": deep_where}]})
        assert refused.status_code == 422 and "nests parentheses" in refused.text
        for function in ("user()", "version()", "current_database()", "raise_error('boom')"):
            refused = http.post("/v1/pipelines", json=base | {"processors": [{"set": {"probe": function}}]})
            assert refused.status_code == 422 and "is not allowed" in refused.text, function
        too_many = http.post("/v1/pipelines", json=base | {"processors": [{"where": "a > 1"}] * 10_000})
        assert too_many.status_code == 422 and too_many.json()["errors"][0]["field"] == "processors"
        # 255 levels as a JSON body, or past the parser's own limit: accepted, the event set aside for the DLQ.
        for levels in (255, 3000):
            accepted = http.post("/logs", content=b'{"a":' * levels + b"1" + b"}" * levels, headers={"Content-Type": "application/json"})
            assert accepted.status_code == 202, accepted.text
    with api.client(api.operator) as http:
        refused = http.post("/v1/tenants", json={"name": "gamma", "max_events_per_s": huge})
        assert refused.status_code == 422, refused.text


def test_shippers_can_send_the_token_as_apikey_or_as_a_basic_auth_password(app_client) -> None:  # noqa: ANN001
    """Log shippers that cannot send a Bearer header: `ApiKey <token>`, Elasticsearch's `ApiKey
    base64(id:token)`, and Basic auth with the token as the password (any user name)."""
    import base64

    def get(authorization: str) -> int:
        return app_client.get("/v1/tables", headers={"Authorization": authorization}).status_code

    basic = base64.b64encode(f"anyone:{TEST_TOKEN}".encode()).decode()
    assert get(f"Basic {basic}") == 200
    assert get(f"ApiKey {TEST_TOKEN}") == 200
    assert get(f"ApiKey {base64.b64encode(f'some-id:{TEST_TOKEN}'.encode()).decode()}") == 200
    assert get(f"Bearer {TEST_TOKEN}") == 200
    wrong = base64.b64encode(b"anyone:calve_wrong").decode()
    assert get(f"Basic {wrong}") == 401
    assert get(f"Basic {base64.b64encode(TEST_TOKEN.encode()).decode()}") == 401, "no user:password pair"
    assert get("Basic !!!") == 401
    assert get(f"Digest {TEST_TOKEN}") == 401
    answer = app_client.get("/v1/tables", headers={"Authorization": ""})
    assert answer.status_code == 401 and "Basic auth" in answer.json()["detail"]


def test_apikey_takes_a_token_of_any_shape_and_a_probe_checks_the_token_it_sends(app_client) -> None:  # noqa: ANN001
    """An operator-chosen token (CALVE_BOOTSTRAP_TOKEN) needs no `calve_` prefix: as `ApiKey <token>`
    it used to fail (only base64(id:token) worked). And `GET /` with a wrong token answered 200, so a
    shipper's start-up check passed and the 401 came on its first `_bulk`."""
    import base64

    from sqlmodel import Session as DbSession

    from service.tenancy.tenants import get_tenant, issue_token

    chosen = "my-own-token-of-40-characters-0123456789"
    with DbSession(app_client.app.state.engine) as session:
        issue_token(session, get_tenant(session, "demo"), "read", raw=chosen)
    for authorization in (f"ApiKey {chosen}", f"ApiKey {base64.b64encode(f'id:{chosen}'.encode()).decode()}", f"Bearer {chosen}"):
        assert app_client.get("/v1/tables", headers={"Authorization": authorization}).status_code == 200, authorization
    assert app_client.get("/v1/tables", headers={"Authorization": "ApiKey not-a-token"}).status_code == 401
    probe = {"Accept": "application/vnd.elasticsearch+json; compatible-with=8"}
    assert app_client.get("/", headers=probe | {"Authorization": f"ApiKey {chosen}"}).status_code == 200
    wrong = app_client.get("/", headers=probe | {"Authorization": "ApiKey calve_wrong"})
    assert wrong.status_code == 401 and wrong.json()["detail"] == "unknown or revoked token"
