"""The change feed's memory bound, against a real api process: an initial load of a 1,000,000-row
table, read through a consumer page by page, grows the api's RSS by less than 64 MiB."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

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
