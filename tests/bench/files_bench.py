"""`make bench-files`: Parquet files written elsewhere, registered through POST /v1/tables/{name}/files.

Starts `calve up` on a fresh data directory, creates a day-partitioned table, writes BENCH_FILES
small Parquet files (BENCH_ROWS_PER_FILE rows each, one day per file) into its data location with
pyarrow, then registers them two ways:
- notifications: BENCH_PRODUCERS callers, one file per call, answered once durable (202), as an
  object store's webhook delivers event notifications; each file's time from notification to
  visible is its receipt's commit time less its creation time;
- lists: BENCH_PER_CALL files per call from the same number of callers, with `wait=true` (the
  answer comes once the files are committed, i.e. visible to readers).
- burst: BENCH_BURST_FILES files in calls of the most a call may hold (1,000), all at once,
  answered once durable: the most one tenant can hand the table's leader in a moment.
Reports files registered per second (until the last file is visible), notification-to-visible
p50/p99, and how many snapshots the registrations took (one per commit interval, not one per
file). Meanwhile a bystander, another tenant, sends BYSTANDER_EVENTS events to its `logs` with
`wait=true` from BYSTANDER_THREADS producers: its latency p50/p99 calm (before the first registration) and
during each way says whether one tenant's registrations hold up the others' commits. The last
line is one JSON object.

Knobs (environment): BENCH_FILES (2000 per way), BENCH_ROWS_PER_FILE (100), BENCH_PRODUCERS (50),
BENCH_PER_CALL (100), BENCH_BURST_FILES (8000; 0 skips the burst).
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
from tests.chaos.scenarios import Producers

FILES = int(os.environ.get("BENCH_FILES", "2000"))
ROWS_PER_FILE = int(os.environ.get("BENCH_ROWS_PER_FILE", "100"))
PRODUCERS = int(os.environ.get("BENCH_PRODUCERS", "50"))
PER_CALL = int(os.environ.get("BENCH_PER_CALL", "100"))
BURST_FILES = int(os.environ.get("BENCH_BURST_FILES", "8000"))
BURST_PER_CALL = 1000  # Settings.registration_max_files' default
BYSTANDER_EVENTS, BYSTANDER_PAUSE_S, BYSTANDER_THREADS = 100, 0.2, 4
WARM_S, CALM_S = 10.0, 20.0  # the bystander's first answers (its table created) are not counted as calm
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


class Bystander(Producers):
    """Another tenant's producers (BYSTANDER_THREADS): BYSTANDER_EVENTS events with wait=true, each
    BYSTANDER_PAUSE_S after its last answer; each answer's (time sent, seconds to it) kept."""

    join_s = 130.0

    def __init__(self, port: int, data_dir: Path) -> None:
        from sqlmodel import Session

        from service.core.db import get_engine
        from service.tenancy.tenants import create_tenant, issue_token

        with Session(get_engine(Settings(data_dir=data_dir).resolved_database_url())) as session:
            self.token = issue_token(session, create_tenant(session, "bystander"))[1]
        self.url = f"http://127.0.0.1:{port}"
        self.answers: list[tuple[float, float]] = []
        self.failed = 0
        super().__init__(BYSTANDER_THREADS)

    def _produce(self, _producer: int) -> None:
        body = b"\n".join(orjson.dumps({"ts": 1_764_000_000_000 + i, "level": "INFO", "service": "bystander", "message": "m"})
                          for i in range(BYSTANDER_EVENTS))
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/x-ndjson"}
        with httpx.Client(base_url=self.url, headers=headers, timeout=120) as http:
            while not self._stop.is_set():
                sent = time.time()
                answer = http.post("/logs", content=body, params={"wait": "true", "timeout": "60"})
                with self._lock:
                    if answer.status_code == 200:
                        self.answers.append((sent, time.time() - sent))
                    else:
                        self.failed += 1
                self._stop.wait(BYSTANDER_PAUSE_S)

    def between(self, start: float, end: float) -> dict:
        latencies = sorted(latency for sent, latency in self.answers if start <= sent < end)
        if not latencies:
            return {"requests": 0}
        return {"requests": len(latencies), "p50_s": round(statistics.median(latencies), 3),
                "p99_s": round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 3)}


def snapshots_since(data_dir: Path, since_ms: int) -> tuple[int, int]:
    """Snapshots of the table since `since_ms` that added registered files, and those files."""
    table = open_catalog(Settings(data_dir=data_dir)).load_table(("demo", "landed"))
    made = [s for s in table.metadata.snapshots if s.timestamp_ms >= since_ms and SUMMARY_REGISTERED in s.summary.additional_properties]
    return len(made), sum(int(s.summary.additional_properties[SUMMARY_REGISTERED]) for s in made)


def main() -> None:
    results = {}
    ways = [("notifications", FILES, 1, False), ("lists", FILES, PER_CALL, True)]
    if BURST_FILES:
        ways.append(("burst", BURST_FILES, BURST_PER_CALL, False))
    with embedded_stack("calve-files-") as (data_dir, port):
        location = setup(port)
        bystander = Bystander(port, data_dir)
        bystander.start()
        time.sleep(WARM_S)
        calm_from = time.time()
        time.sleep(CALM_S)
        calm = bystander.between(calm_from, time.time())
        say(f"bystander calm: {calm}")
        for way, count, per_call, wait in ways:
            paths = write_files(location, way, count)
            since_ms = int(time.time() * 1000)
            seconds, latencies, failures = asyncio.run(register(port, paths, per_call, wait))
            snapshots, counted = snapshots_since(data_dir, since_ms)
            p50, p99 = statistics.median(latencies), statistics.quantiles(latencies, n=100)[98] if len(latencies) > 1 else latencies[0]
            during = bystander.between(since_ms / 1000, since_ms / 1000 + seconds)
            say(f"{way} ({per_call} per call, {min(PRODUCERS, -(-count // per_call))} callers): {count / seconds:,.0f} files/s; "
                f"notification to visible p50 {p50:.2f}s p99 {p99:.2f}s; {snapshots} snapshots for {counted:,} files; "
                f"{failures} failed calls; bystander meanwhile {during}")
            results[way] = {
                "files": count, "files_per_s": round(count / seconds, 1), "visible_p50_s": round(p50, 3), "visible_p99_s": round(p99, 3),
                "snapshots": snapshots, "files_committed": counted, "failed_calls": failures, "bystander": during,
            }
        bystander.stop()
    results["bystander_calm"] = calm
    results["bystander_failed"] = bystander.failed
    print(orjson.dumps({"rows_per_file": ROWS_PER_FILE, **results}).decode(), flush=True)


if __name__ == "__main__":
    main()
