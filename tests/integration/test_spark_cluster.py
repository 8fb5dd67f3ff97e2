"""Calve on a Spark standalone cluster (`calve up --spark-workers 2`): a master, two workers and
the Spark Connect server as four JVMs, the jobs run by two executors in JVMs of their own.
Spark's own REST API tells where the tasks ran."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import orjson
import pytest

from service.iceberg.rewrites import live_data_files
from tests.conftest import Stack, all_committed, assert_exactly_once, post_batches, wait_until
from tests.harness import SparkServer, duckdb_rows

pytestmark = [pytest.mark.spark, pytest.mark.long]  # four JVMs more: make test-long runs it

PEOPLE = {
    "name": "people", "source": {"http": {"path": "/people"}},
    "sinks": [{
        "table": "people", "auto_create": True, "operation": "op", "identifier_columns": ["id"],
        "schema": {
            "columns": [{"name": "id", "type": "long", "required": True}, {"name": "name", "type": "string"}],
            "partition_spec": [{"column": "id", "transform": "bucket[2]"}],
        },
    }],
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkServer]:
    server = SparkServer(tmp_path_factory.mktemp("spark-cluster"), driver_memory="1g", workers=2).start()
    yield server
    server.stop_cluster()


@pytest.fixture
def spark_remote(cluster: SparkServer) -> str:
    return cluster.remote  # the stacks of this module use the cluster, not the session's local server


def executors(cluster: SparkServer) -> dict[str, dict]:
    base = f"http://127.0.0.1:{cluster.ui_port}/api/v1/applications"
    (app,) = httpx.get(base, timeout=10).json()
    return {e["id"]: e for e in httpx.get(f"{base}/{app['id']}/executors", timeout=10).json()}


def send(stack: Stack, events: list[dict]) -> dict:
    with stack.client() as http:
        answer = http.post("/people?wait=true&timeout=120", content=b"\n".join(orjson.dumps(e) for e in events),
                           headers={"Content-Type": "application/x-ndjson"})
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_ingest_a_partitioned_pipeline_row_changes_and_compaction_run_on_the_workers(cluster: SparkServer, stack_factory) -> None:  # noqa: ANN001
    master = httpx.get(f"{cluster.cluster.master_ui}/json/", timeout=10).json()
    assert master["aliveworkers"] == 2
    (app,) = master["activeapps"]
    assert app["name"] == "calve-spark-connect" and app["cores"] == 2, app
    assert set(executors(cluster)) == {"driver", "0", "1"}, "one executor per worker"

    stack = stack_factory(CALVE_UPKEEP_INTERVAL_S="3600")
    receipts = post_batches(stack, batches=4, per_batch=250, prefix="c")
    wait_until(lambda: all_committed(stack, receipts), timeout_s=120, what="the logs committed")
    assert_exactly_once(stack, expected=1000)

    with stack.client() as http:
        assert http.post("/v1/pipelines", json=PEOPLE).status_code == 201
    model = {}
    for round_ in range(3):
        inserts = [{"op": "insert", "id": round_ * 100 + i, "name": f"p{round_}-{i}"} for i in range(100)]
        assert send(stack, inserts)["tables"]["people"]["changes"]["inserted"] == 100
        model.update({e["id"]: e["name"] for e in inserts})
    changes = [{"op": "update", "id": i, "name": f"u{i}"} for i in range(0, 300, 3)] + [{"op": "delete", "id": i} for i in range(1, 300, 3)]
    assert send(stack, changes)["tables"]["people"]["changes"] == {"inserted": 0, "updated": 100, "deleted": 100, "noop": 0}
    model.update({i: f"u{i}" for i in range(0, 300, 3)})
    for i in range(1, 300, 3):
        del model[i]

    table = stack.catalog().load_table(("demo", "people"))
    assert {row["id"]: row["name"] for row in table.scan().to_arrow().to_pylist()} == model
    partitions = {file.partition for file in live_data_files(table).values()}
    with stack.client() as http:
        answer = http.post("/v1/tables/people/maintenance", json={"tasks": ["compact"], "wait_s": 120})
    assert answer.status_code == 200 and answer.json()["tasks"]["compact"]["outcome"] == "ok", answer.text
    table = stack.catalog().load_table(("demo", "people"))
    assert {file.partition for file in live_data_files(table).values()} == partitions and len(live_data_files(table)) == len(partitions)
    assert {row["id"]: row["name"] for row in duckdb_rows(table)} == model, "DuckDB reads what the executors wrote"

    # Every task ran on the workers' executors, none in the Connect server's JVM, and both took work.
    ran = {name: e["totalTasks"] for name, e in executors(cluster).items()}
    assert ran["driver"] == 0 and ran["0"] > 0 and ran["1"] > 0, ran
