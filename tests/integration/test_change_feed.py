"""The change feed against real processes: a large snapshot's changes computed on Spark by a
writer read the same as computed in memory; an initial load of a 1,000,000-row table, read
through a consumer page by page, grows the api's RSS by less than 64 MiB."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from service.core import keys
from service.iceberg.changelog import Changelog, lineage, snapshot_files
from service.protocol import feeds
from service.protocol.feeds import DiffResult
from tests.api.test_change_feed import rewrite, rows
from tests.conftest import Stack

ROWS, FILES, PAGE = 1_000_000, 4, 10_000


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_million_row_initial_load_keeps_the_api_memory_flat(stack_factory) -> None:  # noqa: ANN001
    stack: Stack = stack_factory(roles=("api",))
    catalog = stack.catalog()
    catalog.create_namespace_if_not_exists("demo")
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string()), pa.field("n", pa.float64())])
    table = catalog.create_table(("demo", "big"), schema)
    per_file = ROWS // FILES
    for part in range(FILES):
        ids = pa.array(range(part * per_file, (part + 1) * per_file), pa.int64())
        table.append(pa.table({"id": ids, "name": pa.compute.cast(ids, pa.string()), "n": pa.compute.cast(ids, pa.float64())}, schema=schema))
    pid = stack.procs["api"].pid
    seen, peak, baseline = 0, 0, None
    with stack.client() as http:
        assert http.post("/v1/tables/big/consumers", json={"name": "load", "start": "latest", "initial_load": True}).status_code == 201
        while True:
            page = http.get("/v1/tables/big/consumers/load/changes", params={"limit": PAGE}).json()
            seen += len(page["changes"])
            assert http.post("/v1/tables/big/consumers/load/ack", json={"cursor": page["cursor"]}).status_code == 200
            rss = rss_bytes(pid)
            baseline = baseline or rss  # after the first page: the libraries it needs are loaded
            peak = max(peak, rss)
            if not page["more"]:
                break
    assert seen == ROWS
    growth = peak - baseline
    print(f"initial load of {ROWS} rows in pages of {PAGE}: api RSS {baseline >> 20} MiB after the first page, peak {peak >> 20} MiB")
    assert growth < 64 * 1024 * 1024, f"the api's RSS grew by {growth >> 20} MiB"


def test_a_large_snapshots_changes_come_from_spark_as_they_would_from_memory(stack_factory) -> None:  # noqa: ANN001
    """With CALVE_FEED_SPARK_ROWS=1 every snapshot that removed and added files is diffed by a
    writer on Spark: carryover dropped (as a multiset, without identifier columns too), updates
    paired; the api streams what the writer left, row for row as the in-memory path computes it."""
    import orjson
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    stack: Stack = stack_factory(roles=("api", "writer"), CALVE_FEED_SPARK_ROWS="1")
    catalog = stack.catalog()
    catalog.create_namespace_if_not_exists("demo")
    for name, identifier in (("keyed", [1]), ("plain", [])):
        schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "name", StringType()), identifier_field_ids=identifier)
        table = catalog.create_table(("demo", name), schema)
        table.append(rows(*[(i, f"v{i}") for i in range(50)], (7, "v7")))
        table.append(rows(*[(i, f"w{i}") for i in range(50, 80)]))
        before = catalog.load_table(("demo", name)).current_snapshot().snapshot_id
        changed = [(i, "changed" if i % 10 == 3 else f"v{i}") for i in range(50) if i % 10 != 5] + [(i, f"w{i}") for i in range(50, 80)] + [(99, "new")]
        table = rewrite(catalog, table, rows(*changed))
        snapshot = lineage(table, before)[0]
        changelog = Changelog(table)
        expected = [row for batch in changelog.rows(changelog.plan(snapshot_files(table, snapshot))) for row in batch.to_pylist()]
        with stack.client() as http:
            answer = http.get(f"/v1/tables/{name}/changes", params={"from_snapshot": before})
        assert answer.status_code == 200, answer.text
        got = [orjson.loads(line) for line in answer.text.splitlines()]
        assert got == [orjson.loads(orjson.dumps(row)) for row in expected], name
        assert {row["_change_type"] for row in got} == ({"UPDATE_BEFORE", "UPDATE_AFTER", "DELETE", "INSERT"} if identifier else {"DELETE", "INSERT"})
        answered = stack.redis.hget(keys.feed_diff_key("demo", name, snapshot.snapshot_id, table.schema().schema_id), feeds.RESULT)
        assert answered is not None and DiffResult.from_json(answered).files, "a writer computed them on Spark"
