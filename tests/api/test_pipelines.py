"""/v1/pipelines: versioned definitions, their validation (422 naming the field), and ingest on
their paths. The api runs against real Redis and both metadata DB backends."""

from __future__ import annotations

import pytest
from sqlmodel import Session

from service.core.db import get_engine
from service.tenancy.tenants import issue_token
from tests.conftest import TEST_TOKEN, Stack
from tests.integration.test_pipelines import CHECKOUT


@pytest.fixture
def api(stack_factory, metadata_url: str) -> Stack:  # noqa: ANN001
    return stack_factory(roles=("api",), CALVE_DATABASE_URL=metadata_url)


def definition(**overrides) -> dict:  # noqa: ANN003
    base = {"name": "orders", "source": {"http": {"path": "/orders"}}, "sinks": [{"table": "orders", "auto_create": True}]}
    return base | overrides


def test_definitions_are_versioned_and_old_versions_stay_readable(api: Stack) -> None:
    with api.client() as http:
        created = http.post("/v1/pipelines", content=CHECKOUT, headers={"Content-Type": "application/yaml"})
        assert created.status_code == 201, created.text
        assert created.json()["version"] == 1 and created.json()["path"] == "/checkout"
        assert http.post("/v1/pipelines", content=CHECKOUT, headers={"Content-Type": "application/yaml"}).status_code == 409

        changed = http.get("/v1/pipelines/checkout").json()["definition"]
        changed["routes"]["errors"] = "status >= 400"
        replaced = http.put("/v1/pipelines/checkout", json=changed)
        assert replaced.status_code == 200, replaced.text
        assert replaced.json()["version"] == 2

        assert http.get("/v1/pipelines/checkout").json()["definition"]["routes"]["errors"] == "status >= 400"
        first = http.get("/v1/pipelines/checkout", params={"version": 1}).json()
        assert first["definition"]["routes"]["errors"] == "status >= 500"
        assert first["definition"]["sinks"][0]["schema"]["partition_spec"] == [{"column": "ts", "transform": "day"}]
        assert [v["version"] for v in http.get("/v1/pipelines/checkout/versions").json()["versions"]] == [1, 2]
        diff = http.get("/v1/pipelines/checkout/diff", params={"from": 1}).json()
        assert (diff["from"], diff["to"]) == (1, 2), "to: the current version by default"
        assert [line for line in diff["diff"].splitlines() if line[:1] in "+-"] == [
            "--- checkout version 1", "+++ checkout version 2", "-  errors: status >= 500", "+  errors: status >= 400",
        ], diff["diff"]
        assert http.get("/v1/pipelines/checkout/diff", params={"from": 2, "to": 2}).json()["diff"] == ""
        missing = http.get("/v1/pipelines/checkout/diff", params={"from": 1, "to": 9})
        assert missing.status_code == 404 and "no version 9" in missing.json()["detail"]
        assert http.get("/v1/pipelines/checkout/diff").status_code == 422, "from is required"

        listed = {p["name"]: p for p in http.get("/v1/pipelines").json()["pipelines"]}
        assert listed["logs"]["builtin"] and listed["logs"]["path"] == "/logs"
        assert listed["checkout"]["version"] == 2

        assert http.delete("/v1/pipelines/checkout").status_code == 200
        assert "checkout" not in {p["name"] for p in http.get("/v1/pipelines").json()["pipelines"]}
        assert http.get("/v1/pipelines/checkout", params={"version": 1}).status_code == 200, "history stays readable"
        assert http.post("/checkout", json={"status": 1}).status_code == 404, "a deleted pipeline's path is free"
        again = http.post("/v1/pipelines", content=CHECKOUT, headers={"Content-Type": "application/yaml"})
        assert again.status_code == 201 and again.json()["version"] == 3


def test_the_builtin_logs_pipeline_is_replaced_by_a_stored_version(api: Stack) -> None:
    with api.client() as http:
        assert http.get("/v1/pipelines/logs").json()["builtin"] is True
        assert http.delete("/v1/pipelines/logs").status_code == 409
        replaced = http.put("/v1/pipelines/logs", json=definition(name="logs", source={"http": {"path": "/logs"}}, sinks=[{"table": "app_logs", "auto_create": True}]))
        assert replaced.status_code == 200, replaced.text
        assert replaced.json()["version"] == 1 and not replaced.json()["builtin"]
        assert http.get("/v1/pipelines/logs").json()["definition"]["sinks"][0]["table"] == "app_logs"


def test_ingest_goes_to_the_pipeline_at_the_path(api: Stack) -> None:
    with api.client() as http:
        assert http.post("/v1/pipelines", json=definition()).status_code == 201
        answer = http.post("/orders", json=[{"id": 1}, {"id": 2}])
        assert answer.status_code == 202, answer.text
        assert http.get(f"/v1/receipts/{answer.json()['receipt']}").json()["pipeline"] == "orders"
        unknown = http.post("/nowhere", json={"id": 1})
        assert unknown.status_code == 404 and "GET /v1/pipelines" in unknown.json()["detail"]
    with Session(get_engine(api.settings.resolved_database_url())) as session:
        from service.tenancy.tenants import get_tenant

        _row, only_logs = issue_token(session, get_tenant(session, "demo"), "ingest", pipelines=["logs"])
    with api.client(only_logs) as http:
        assert http.post("/logs", json={"id": 1}).status_code == 202
        refused = http.post("/orders", json={"id": 1})
        assert refused.status_code == 403 and "orders" in refused.json()["detail"]


def test_another_tenant_neither_sees_nor_reaches_a_pipeline(api: Stack) -> None:
    with Session(get_engine(api.settings.resolved_database_url())) as session:
        from service.tenancy.tenants import create_tenant

        _row, other = issue_token(session, create_tenant(session, "other"), "ingest,read,admin")
    with api.client() as http:
        assert http.post("/v1/pipelines", json=definition()).status_code == 201
    with api.client(other) as http:
        assert "orders" not in {p["name"] for p in http.get("/v1/pipelines").json()["pipelines"]}
        assert http.get("/v1/pipelines/orders").status_code == 404
        assert http.post("/orders", json={"id": 1}).status_code == 404
        # The same name and path are free for this tenant.
        assert http.post("/v1/pipelines", json=definition()).status_code == 201


BAD_DEFINITIONS = [
    ("processors[0]", {"processors": [{"where": "status >>= 1"}]}),
    ("processors[0]", {"processors": [{"set": {"x": "amount +"}}]}),
    ("processors[0]", {"processors": [{"where": "a = 1", "drop": ["b"]}]}),
    ("processors[0]", {"processors": [{"where": "reflect('java.lang.Runtime', 'getRuntime')"}]}),
    ("processors[0]", {"processors": [{"where": "id IN (SELECT id FROM parquet.`/etc`)"}]}),
    ("routes.errors", {"routes": {"errors": "status >="}}),
    ("sinks[0].routes", {"sinks": [{"table": "orders", "auto_create": True, "routes": ["missing"]}]}),
    ("sinks[0].schema.columns[0].type", {"sinks": [{"table": "orders", "auto_create": True, "schema": {"columns": [{"name": "a", "type": "strng"}]}}]}),
    ("sinks[0].schema.partition_spec[0].transform", {"sinks": [{"table": "orders", "auto_create": True, "schema": {"columns": [{"name": "a", "type": "long"}], "partition_spec": [{"column": "a", "transform": "minute"}]}}]}),
    ("sinks[0].schema", {"sinks": [{"table": "orders", "auto_create": True, "schema": {"columns": [{"name": "a", "type": "long"}], "partition_spec": [{"column": "a", "transform": "day"}]}}]}),
    ("sinks[0].schema", {"sinks": [{"table": "orders", "auto_create": True, "schema": {"columns": [{"name": "a", "type": "double"}], "partition_spec": [{"column": "a", "transform": "bucket[16]"}]}}]}),
    ("sinks[0].schema.columns[0].type", {"sinks": [{"table": "orders", "auto_create": True, "schema": {"columns": [{"name": "a", "type": "struct<id: uuid>"}]}}]}),
    ("sinks[0].table", {"sinks": [{"table": "_calve_dlq", "auto_create": True}]}),
    ("processors[0]", {"processors": [{"set": {"_calve_receipt": "'forged'"}}]}),
    ("routes.peek", {"routes": {"peek": "_calve_receipt = 'x'"}}),
    ("sinks[0]", {"sinks": [{"table": "${service}_x", "auto_create": True, "schema": {"columns": [{"name": "a", "type": "long"}]}}]}),
    ("sinks[0].table", {"sinks": [{"table": "missing_table", "auto_create": False}]}),
    ("sinks[0].table", {"sinks": [{"table": "../../etc/passwd", "auto_create": True}]}),
    ("sinks[0].table", {"sinks": [{"table": "${a}.${b}", "auto_create": True}]}),
    ("sinks", {"sinks": []}),
    ("source.http.path", {"source": {"http": {"path": "/logs"}}}),
    ("source.http.path", {"source": {"http": {"path": "/v1/tokens"}}}),
    ("source.http.path", {"source": {"http": {"path": "no-slash"}}}),
    ("name", {"name": "Bad-Name"}),
    ("sinks[0].shema", {"sinks": [{"table": "orders", "auto_create": True, "shema": {}}]}),
    # The reported heavy definition: 50 routes of ~4,000 characters each (refused before any is parsed).
    ("routes", {"routes": {f"r{i}": " OR ".join(["a = 1"] * 400) for i in range(50)}}),
]


@pytest.mark.parametrize(("field", "change"), BAD_DEFINITIONS, ids=[f"{f}-{i}" for i, (f, _c) in enumerate(BAD_DEFINITIONS)])
def test_bad_definitions_are_refused_naming_the_field(app_client, field: str, change: dict) -> None:  # noqa: ANN001
    answer = app_client.post("/v1/pipelines", json=definition(**change))
    assert answer.status_code == 422, answer.text
    fields = [error["field"] for error in answer.json()["errors"]]
    assert field in fields, answer.json()
    assert all(error["error"] for error in answer.json()["errors"])
    assert app_client.get("/v1/pipelines/orders").status_code == 404, "nothing was stored"


def test_a_path_taken_by_another_pipeline_is_refused(api: Stack) -> None:
    with api.client() as http:
        assert http.post("/v1/pipelines", json=definition()).status_code == 201
        clash = http.post("/v1/pipelines", json=definition(name="orders_copy"))
        assert clash.status_code == 422
        assert clash.json()["errors"] == [{"field": "source.http.path", "error": "/orders is the path of pipeline 'orders'; choose another"}]


def test_unreadable_bodies_are_400_and_yaml_aliases_are_refused(api: Stack) -> None:
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: [*b, *b, *b, *b, *b, *b, *b, *b, *b]\n"
    with api.client() as http:
        refused = http.post("/v1/pipelines", content=bomb, headers={"Content-Type": "application/yaml"})
        assert refused.status_code == 400 and "aliases" in refused.json()["detail"]
        assert http.post("/v1/pipelines", content="{not json").status_code == 400
        assert http.post("/v1/pipelines", content="- a list", headers={"Content-Type": "application/yaml"}).status_code == 422


def test_only_admins_change_pipelines(api: Stack) -> None:
    with Session(get_engine(api.settings.resolved_database_url())) as session:
        from service.tenancy.tenants import get_tenant

        _row, reader = issue_token(session, get_tenant(session, "demo"), "read,ingest")
    with api.client(reader) as http:
        assert http.post("/v1/pipelines", json=definition()).status_code == 403
        assert http.get("/v1/pipelines").status_code == 200
    assert TEST_TOKEN


def test_a_sink_that_would_switch_a_copy_on_write_table_to_merge_on_read_is_answered_with_a_warning(app_client) -> None:  # noqa: ANN001
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    from service.iceberg.catalog import open_catalog

    catalog = open_catalog(app_client.app.state.settings)
    catalog.create_namespace_if_not_exists("demo")
    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "v", StringType()), identifier_field_ids=[1])
    catalog.create_table(("demo", "accounts_cow"), schema, properties={"write.delete.mode": "copy-on-write"})
    catalog.create_table(("demo", "accounts_mor"), schema, properties={"write.delete.mode": "merge-on-read"})

    def upserts(name: str, table: str, **sink: str) -> dict:
        return {"name": name, "source": {"http": {"path": f"/{name}"}},
                "sinks": [{"table": table, "mode": "upsert", "identifier_columns": ["id"], **sink}]}

    switched = app_client.post("/v1/pipelines", json=upserts("upsert_cow", "accounts_cow"))
    assert switched.status_code == 201, switched.text
    (warning,) = switched.json()["warnings"]
    assert "'accounts_cow' is copy-on-write" in warning and "write_mode: copy-on-write" in warning
    replaced = app_client.put("/v1/pipelines/upsert_cow", json=upserts("upsert_cow", "accounts_cow", write_mode="copy-on-write"))
    assert replaced.status_code == 200 and "warnings" not in replaced.json(), "the mode is said: nothing to warn of"
    kept = app_client.post("/v1/pipelines", json=upserts("upsert_mor", "accounts_mor"))
    assert kept.status_code == 201 and "warnings" not in kept.json(), "already merge-on-read: nothing switches"
    appends = app_client.post("/v1/pipelines", json={"name": "appends", "source": {"http": {"path": "/appends"}},
                                                     "sinks": [{"table": "accounts_cow"}]})
    assert appends.status_code == 201 and "warnings" not in appends.json(), "appends write no deletes"
