"""`make bench-upsert`: row changes (copy-on-write) against a 1,000,000-row table partitioned by day.

Starts `calve up` on a fresh data directory, loads BENCH_ROWS rows (ids 0..N-1, spread over 30
days, id order = day order) through an append pipeline into a table whose identifier is `id`, then
lets producers POST upserts with wait=true for BENCH_SECONDS: each request changes 1,000 keys of
the most recent 7 days (1% of the table every ten requests). It reports changed rows per second,
wait=true p50/p99, and write amplification: rows written by the overwrite snapshots per row
changed (a file holding one changed key is rewritten whole). The last line is one JSON object.

Knobs (environment): BENCH_ROWS (1000000), BENCH_SECONDS (60), BENCH_PRODUCERS (4).
"""

from __future__ import annotations

import asyncio
import datetime
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp
import httpx
import orjson
from pyiceberg.catalog.sql import SqlCatalog

from service.cli.processes import free_port
from tests.bench.ingest_bench import TOKEN, say, start_stack

DAYS = 30
RECENT_DAYS = 7
PER_REQUEST = 1000
START = datetime.datetime(2026, 10, 1, tzinfo=datetime.timezone.utc)
SCHEMA = {"columns": [
    {"name": "id", "type": "long", "required": True}, {"name": "ts", "type": "timestamptz", "required": True},
    {"name": "balance", "type": "long"}, {"name": "name", "type": "string"},
], "partition_spec": [{"column": "ts", "transform": "day"}]}


def row(key: int, rows: int, balance: int) -> dict:
    day = key * DAYS // rows
    ts = START + datetime.timedelta(days=day, seconds=key % 86400)
    return {"id": key, "ts": ts.isoformat(), "balance": balance, "name": f"account-{key:07d}"}


def setup(port: int, rows: int) -> None:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=600) as http:
        # The upsert sink creates the table (with id as its identifier field) ...
        answer = http.post("/v1/pipelines", json={
            "name": "accounts", "source": {"http": {"path": "/accounts"}},
            "sinks": [{"table": "accounts", "auto_create": True, "schema": SCHEMA, "identifier_columns": ["id"], "mode": "upsert"}],
        })
        assert answer.status_code == 201, answer.text
        first = http.post("/accounts?wait=true&timeout=300", content=orjson.dumps(row(0, rows, 0)))
        assert first.status_code == 200, first.text
        # ... and the rest is appended, 20,000 rows a request.
        answer = http.post("/v1/pipelines", json={
            "name": "accounts_load", "source": {"http": {"path": "/accounts_load"}}, "sinks": [{"table": "accounts"}],
        })
        assert answer.status_code == 201, answer.text
        started = time.monotonic()
        for start in range(1, rows, 20_000):
            body = b"\n".join(orjson.dumps(row(k, rows, 0)) for k in range(start, min(rows, start + 20_000)))
            answer = http.post("/accounts_load?wait=true&timeout=600", content=body, headers={"Content-Type": "application/x-ndjson"})
            assert answer.status_code == 200, answer.text
        say(f"loaded {rows:,} rows in {time.monotonic() - started:.0f} s")


async def upsert(port: int, rows: int, seconds: float, producers: int) -> tuple[int, list[float], int]:
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/x-ndjson"}
    url = f"http://127.0.0.1:{port}/accounts?wait=true&timeout=300"
    recent = rows - rows * RECENT_DAYS // DAYS
    changed, latencies, failures = 0, [], 0
    rng = random.Random(7)
    async with aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=600)) as client:

        async def one(until: float) -> None:
            nonlocal changed, failures
            while time.monotonic() < until:
                keys = rng.sample(range(recent, rows), PER_REQUEST)
                body = b"\n".join(orjson.dumps(row(k, rows, rng.randrange(10**6))) for k in keys)
                sent = time.monotonic()
                async with client.post(url, data=body) as answer:
                    payload = await answer.read()
                if answer.status != 200:
                    failures += 1
                    continue
                latencies.append(time.monotonic() - sent)
                changed += orjson.loads(payload)["tables"]["accounts"]["changes"]["updated"]

        until = time.monotonic() + seconds
        await asyncio.gather(*(one(until) for _ in range(producers)))
    return changed, latencies, failures


def amplification(data_dir: Path, since_ms: int) -> tuple[int, int]:
    """(rows written, files rewritten) by the overwrite snapshots committed since `since_ms`."""
    catalog = SqlCatalog("calve", uri=f"sqlite:///{data_dir / 'catalog.db'}", warehouse=(data_dir / "warehouse").as_uri())
    table = catalog.load_table(("demo", "accounts"))
    written = rewritten = 0
    for snapshot in table.snapshots():
        if snapshot.timestamp_ms >= since_ms and snapshot.summary and snapshot.summary.operation.value == "overwrite":
            written += int(snapshot.summary.additional_properties.get("added-records", 0))
            rewritten += int(snapshot.summary.additional_properties.get("deleted-data-files", 0))
    return written, rewritten


def main() -> None:
    rows = int(os.environ.get("BENCH_ROWS", "1000000"))
    seconds = float(os.environ.get("BENCH_SECONDS", "60"))
    producers = int(os.environ.get("BENCH_PRODUCERS", "4"))
    os.environ.setdefault("CALVE_SNAPSHOT_MAX_AGE_S", "86400")  # keep the measured window's snapshots
    os.environ.setdefault("CALVE_SNAPSHOT_MAX_COUNT", "100000")
    with tempfile.TemporaryDirectory(prefix="calve-upsert-") as tmp:
        data_dir = Path(tmp) / "data"
        data_dir.mkdir()
        port = free_port()
        say(f"starting the embedded stack (data in {data_dir}) ...")
        stack = start_stack(data_dir, port)
        try:
            setup(port, rows)
            say(f"load: {producers} producers, {PER_REQUEST}-key upserts over the last {RECENT_DAYS} days, wait=true, {seconds:.0f} s")
            since_ms = int(time.time() * 1000)
            changed, latencies, failures = asyncio.run(upsert(port, rows, seconds, producers))
            written, files = amplification(data_dir, since_ms)
        finally:
            stack.terminate()
            stack.wait(120)
    p50 = statistics.median(latencies) if latencies else float("nan")
    p99 = statistics.quantiles(latencies, n=100)[98] if len(latencies) >= 2 else float("nan")
    say(f"{changed / seconds:,.0f} changed rows/s; wait=true p50 {p50:.2f}s p99 {p99:.2f}s; "
        f"{written:,} rows written for {changed:,} changed ({files} files rewritten); {failures} non-200 answers")
    print(orjson.dumps({
        "changed_rows_per_s": round(changed / seconds, 1), "ack_p50_s": round(p50, 3), "ack_p99_s": round(p99, 3),
        "write_amplification": round(written / changed, 2) if changed else None, "files_rewritten": files,
        "table_rows": rows, "non_200": failures,
    }).decode(), flush=True)


if __name__ == "__main__":
    main()
