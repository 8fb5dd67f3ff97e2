"""`make bench-files`: Parquet files written elsewhere, registered through POST /v1/tables/{name}/files.

Starts `calve up` on a fresh data directory, creates a day-partitioned table, writes BENCH_FILES
small Parquet files (BENCH_ROWS_PER_FILE rows each, one day per file) into its data location with
pyarrow, then registers them two ways:
- notifications: BENCH_PRODUCERS callers, one file per call, answered once durable (202), as an
  object store's webhook delivers event notifications; each file's time from notification to
  visible is its receipt's commit time less its creation time;
- lists: BENCH_PER_CALL files per call from the same number of callers, with `wait=true` (the
  answer comes once the files are committed, i.e. visible to readers).
Reports files registered per second (until the last file is visible), notification-to-visible
p50/p99, and how many snapshots the registrations took (one per commit interval, not one per
file); the last line is one JSON object.

Knobs (environment): BENCH_FILES (2000 per way), BENCH_ROWS_PER_FILE (100), BENCH_PRODUCERS (50),
BENCH_PER_CALL (100).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import aiohttp
import httpx
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from service.core.config import Settings
from service.core.keys import SUMMARY_REGISTERED
from service.iceberg.catalog import open_catalog
from tests.bench.ingest_bench import TOKEN, embedded_stack, say

FILES = int(os.environ.get("BENCH_FILES", "2000"))
ROWS_PER_FILE = int(os.environ.get("BENCH_ROWS_PER_FILE", "100"))
PRODUCERS = int(os.environ.get("BENCH_PRODUCERS", "50"))
PER_CALL = int(os.environ.get("BENCH_PER_CALL", "100"))
PIPELINE = {
    "name": "landed", "source": {"http": {"path": "/landed"}},
    "sinks": [{"table": "landed", "auto_create": True, "schema": {
        "columns": [{"name": "ts", "type": "timestamptz"}, {"name": "source", "type": "string"}, {"name": "n", "type": "long"}],
        "partition_spec": [{"column": "ts", "transform": "day"}],
    }}],
}


def setup(port: int) -> str:
    """The table (created by its pipeline's first event); returns its data location."""
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=120) as http:
        assert http.post("/v1/pipelines", json=PIPELINE).status_code == 201
        answer = http.post("/landed?wait=true&timeout=120", json={"ts": "2026-11-20T00:00:00Z", "source": "http", "n": 0})
        assert answer.status_code == 200, answer.text
        return http.get("/v1/tables/landed").json()["location"]


def write_files(location: str, way: str, count: int) -> list[str]:
    """`count` files under the table's data location, each of one day, as another writer would."""
    directory = Path(location.removeprefix("file://")) / "data" / "landing" / way
    directory.mkdir(parents=True)
    start = datetime(2026, 11, 1, tzinfo=timezone.utc)
    paths = []
    for i in range(count):
        day = start + timedelta(days=i % 20, seconds=i)
        table = pa.table({
            "ts": pa.array([day] * ROWS_PER_FILE, pa.timestamp("us", tz="UTC")),
            "source": [f"{way}-{i}"] * ROWS_PER_FILE,
            "n": pa.array(range(ROWS_PER_FILE), pa.int64()),
        })
        path = directory / f"part-{i:06d}.parquet"
        pq.write_table(table, path)
        paths.append(path.as_uri())
    return paths


async def register(port: int, paths: list[str], per_call: int, wait: bool) -> tuple[float, list[float], int]:
    """Register every path with PRODUCERS callers; (seconds until every file is visible, each
    file's notification-to-visible seconds, failed calls)."""
    calls = [paths[i:i + per_call] for i in range(0, len(paths), per_call)]
    latencies: list[float] = []
    failures = 0
    queue: asyncio.Queue[list[str]] = asyncio.Queue()
    for call in calls:
        queue.put_nowait(call)
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    url = f"http://127.0.0.1:{port}/v1/tables/landed/files?wait={str(wait).lower()}&timeout=120"
    receipts: list[str] = []
    async with aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=300)) as session:

        async def caller() -> None:
            nonlocal failures
            while not queue.empty():
                call = queue.get_nowait()
                body = orjson.dumps({"files": [{"path": path} for path in call]})
                started = time.time()
                async with session.post(url, data=body) as answer:
                    payload = orjson.loads(await answer.read())
                    if answer.status != (200 if wait else 202) or payload["accepted"] != len(call):
                        failures += 1
                    elif wait:
                        latencies.extend([time.time() - started] * len(call))
                    else:
                        receipts.append(payload["receipt"])

        started = time.time()
        await asyncio.gather(*(caller() for _ in range(min(PRODUCERS, len(calls)))))
        last = time.time()
        for receipt in receipts:  # each file's notification to its commit, from its receipt
            while True:
                async with session.get(f"http://127.0.0.1:{port}/v1/receipts/{receipt}") as answer:
                    state = await answer.json()
                if state["status"] in ("committed", "failed"):
                    break
                await asyncio.sleep(0.2)
            latencies.append(state["committed_at"] - state["created_at"])
            last = max(last, state["committed_at"])
        return last - started, latencies, failures


def snapshots_since(data_dir: Path, since_ms: int) -> tuple[int, int]:
    """Snapshots of the table since `since_ms` that added registered files, and those files."""
    table = open_catalog(Settings(data_dir=data_dir)).load_table(("demo", "landed"))
    made = [s for s in table.metadata.snapshots if s.timestamp_ms >= since_ms and SUMMARY_REGISTERED in s.summary.additional_properties]
    return len(made), sum(int(s.summary.additional_properties[SUMMARY_REGISTERED]) for s in made)


def main() -> None:
    results = {}
    with embedded_stack("calve-files-") as (data_dir, port):
        location = setup(port)
        for way, per_call, wait in (("notifications", 1, False), ("lists", PER_CALL, True)):
            paths = write_files(location, way, FILES)
            since_ms = int(time.time() * 1000)
            seconds, latencies, failures = asyncio.run(register(port, paths, per_call, wait))
            snapshots, counted = snapshots_since(data_dir, since_ms)
            p50, p99 = statistics.median(latencies), statistics.quantiles(latencies, n=100)[98] if len(latencies) > 1 else latencies[0]
            say(f"{way} ({per_call} per call, {PRODUCERS} callers): {FILES / seconds:,.0f} files/s; notification to visible "
                f"p50 {p50:.2f}s p99 {p99:.2f}s; {snapshots} snapshots for {counted:,} files; {failures} failed calls")
            results[way] = {
                "files_per_s": round(FILES / seconds, 1), "visible_p50_s": round(p50, 3), "visible_p99_s": round(p99, 3),
                "snapshots": snapshots, "files_committed": counted, "failed_calls": failures,
            }
    print(orjson.dumps({"files_per_way": FILES, "rows_per_file": ROWS_PER_FILE, **results}).decode(), flush=True)


if __name__ == "__main__":
    main()
