"""`make bench`: committed events/s and wait=true latency of the embedded stack, against a baseline.

Starts `calve up` on a fresh data directory, lets concurrent producers POST 1,000-event NDJSON
requests with wait=true for a fixed time, then stops it and measures, on the same events, what
one process does with no HTTP, Redis or Spark: parse with pyarrow, write Parquet, append with
pyiceberg. It also reports where the cores went in the measured window: CPU seconds per role (api,
writers, committer, Spark JVM, redis-server, the load generator itself) and per 100,000 committed
events, and the mean Spark job and commit times from Calve's metrics (tests/bench/profile.py).
The last line of output is one JSON object.

Shapes (BENCH_SHAPES, comma-separated, in this order on one stack; default
`plain,extra,declared,processors`): `plain`, every event with exactly the table's fields (the
built-in `logs`); `extra`, the same with 2% of events carrying one field the table lacks (kept in
its `_extra` map); `declared`, the same fields with `ts` as ISO 8601 text into a declared schema
(`ts timestamptz`) partitioned by day(ts); `processors`, that with two processors (where, set),
which the full Spark job runs. Each shape is
reported with its ratio to `plain` of the same run; the first is warmed up BENCH_WARMUP_S, the
others BENCH_SHAPE_WARMUP_S (20).

Knobs (environment): BENCH_SECONDS (default 60), BENCH_PRODUCERS (150), BENCH_WARMUP_S (60);
BENCH_WAREHOUSE=seaweedfs starts SeaweedFS and runs the stack on its REST catalog with the
warehouse in its S3 (the baseline stays on local files). Any CALVE_* setting reaches the stack
(CALVE_SPARK_WORKERS=2: a 2-worker Spark cluster).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path

import aiohttp
import httpx
import orjson
import pyarrow.json as pajson
from pyiceberg.catalog.sql import SqlCatalog

from service.cli.processes import free_port
from tests.bench.profile import Sample, breakdown, sample, table

EVENTS_PER_REQUEST = 1000
TOKEN = "calve_bench-token-0123456789abcdefghijklmnopqrstuv"
LEVELS = ["debug", "info", "info", "info", "warn", "error"]
SERVICES = ["checkout", "search", "auth", "payments", "catalog"]


def make_event(i: int) -> dict:
    return {
        "ts": 1_763_800_000_000 + i,
        "level": random.choice(LEVELS),
        "service": random.choice(SERVICES),
        "host": f"web-{random.randint(1, 40):02d}",
        "status": random.choice([200, 200, 200, 201, 404, 500]),
        "latency_ms": round(random.random() * 250, 3),
        "msg": f"request {i:010d} handled " + "".join(random.choices("abcdefghij", k=20)),
    }


EXTRA_NAMES = ["user_id", "trace_id", "region", "retry", "cache_hit"]


def with_extra_field(event: dict, i: int) -> dict:
    """The event and, for 2% of them, one field the built-in `logs` table lacks."""
    if i % 50 == 7:
        name = EXTRA_NAMES[i % len(EXTRA_NAMES)]
        event[name] = {"user_id": f"u-{i % 9973}", "trace_id": f"{i:032x}", "region": "eu-west-1", "retry": i % 3, "cache_hit": i % 2 == 0}[name]
    return event


def with_iso_time(event: dict) -> dict:
    """The event with its ts as ISO 8601 text (UTC, milliseconds), as most shippers send it."""
    event["ts"] = datetime.fromtimestamp(event["ts"] / 1000, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return event


def with_days(i: int) -> dict:
    """An event with an ISO 8601 ts; 200 requests' events span ~4 days: a few partition values per batch."""
    return with_iso_time(make_event(i * 20))


SHAPES = {"plain": make_event, "extra": lambda i: with_extra_field(make_event(i), i), "declared": with_days, "processors": with_days}
# The pipeline each shape posts to (none: the built-in `logs`): a declared schema with the time as
# timestamptz and the table partitioned by day(ts); the same with two processors.
DECLARED_COLUMNS = [
    {"name": "ts", "type": "timestamptz", "required": True}, {"name": "level", "type": "string"}, {"name": "service", "type": "string"},
    {"name": "host", "type": "string"}, {"name": "status", "type": "int"}, {"name": "latency_ms", "type": "double"},
    {"name": "msg", "type": "string"},
]
PIPELINES = {
    "declared": {"name": "declared", "source": {"http": {"path": "/declared"}}, "sinks": [{
        "table": "declared", "auto_create": True, "schema": {"columns": DECLARED_COLUMNS, "partition_spec": [{"column": "ts", "transform": "day"}]},
    }]},
    "processors": {"name": "processed", "source": {"http": {"path": "/processed"}},
                   "processors": [{"where": "level != 'debug'"}, {"set": {"slow": "latency_ms > 200"}}],
                   "sinks": [{
        "table": "processed", "auto_create": True, "schema": {"columns": [*DECLARED_COLUMNS, {"name": "slow", "type": "boolean"}],
                                         "partition_spec": [{"column": "ts", "transform": "day"}]},
    }]},
}


def make_bodies(count: int, shape: str = "plain") -> list[bytes]:
    bodies = []
    for b in range(count):
        bodies.append(b"\n".join(orjson.dumps(SHAPES[shape](b * EVENTS_PER_REQUEST + i)) for i in range(EVENTS_PER_REQUEST)))
    return bodies


def shape_path(port: int, shape: str) -> str:
    """The path the shape's events go to, its pipeline created first where it has one."""
    pipeline = PIPELINES.get(shape)
    if pipeline is None:
        return "/logs"
    answer = httpx.post(f"http://127.0.0.1:{port}/v1/pipelines", json=pipeline, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
    if answer.status_code != 201:
        raise SystemExit(f"creating the {shape} pipeline: {answer.status_code} {answer.text}")
    return pipeline["source"]["http"]["path"]


def say(message: str) -> None:
    print(message, flush=True)


def start_stack(data_dir: Path, port: int) -> subprocess.Popen:
    env = {"CALVE_LOG_LEVEL": "WARNING", **os.environ, "CALVE_DATA_DIR": str(data_dir), "CALVE_PORT": str(port), "CALVE_BOOTSTRAP_TOKEN": TOKEN}
    log = open(data_dir / "calve-up.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "service.cli", "up"], env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"calve up exited ({proc.returncode}); see {data_dir / 'calve-up.log'}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(1)
    proc.terminate()
    raise SystemExit("calve up did not become ready within 240 s")


@contextlib.contextmanager
def embedded_stack(prefix: str) -> Iterator[tuple[Path, int]]:
    """`calve up` on a fresh data directory: (data directory, api port); stopped and removed on leaving."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        data_dir = Path(tmp) / "data"
        data_dir.mkdir()
        port = free_port()
        say(f"starting the embedded stack (data in {data_dir}) ...")
        stack = start_stack(data_dir, port)
        try:
            yield data_dir, port
        finally:
            stack.terminate()
            stack.wait(120)


def operator_token(data_dir: Path) -> str:
    """An operator token of the stack's metadata DB: /metrics is theirs to read."""
    from sqlmodel import Session

    from service.core.config import Settings
    from service.core.db import get_engine
    from service.tenancy.tenants import issue_token

    with Session(get_engine(Settings(data_dir=data_dir).resolved_database_url())) as session:
        return issue_token(session, None, label="bench")[1]


async def produce(
    port: int, path: str, bodies: list[bytes], seconds: float, producers: int, warmup_s: float, take_sample: Callable[[], Sample],
) -> tuple[int, list[float], int, Sample, Sample]:
    """Run producers; returns (events acknowledged as committed in the window, latencies, failures,
    and the stack's CPU and metrics sampled as the window opened and closed).

    aiohttp rather than httpx: with hundreds of connections httpx's pool costs the load generator
    most of a core, which on this machine is taken from the system under test.
    """
    latencies: list[float] = []
    committed = 0
    failures = 0
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/x-ndjson"}
    url = f"http://127.0.0.1:{port}{path}?wait=true&timeout=60"
    connector = aiohttp.TCPConnector(limit=producers, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, headers=headers, timeout=timeout) as client:

        async def one(index: int, counted_from: float, until: float) -> None:
            nonlocal committed, failures
            k = index
            while time.monotonic() < until:
                body = bodies[k % len(bodies)]
                k += producers
                sent = time.monotonic()
                try:
                    async with client.post(url, data=body) as answer:
                        status = answer.status
                        payload = await answer.read()
                except aiohttp.ClientError:
                    failures += 1
                    continue
                done = time.monotonic()
                if status != 200:
                    failures += 1
                    continue
                if sent >= counted_from and done <= until:
                    latencies.append(done - sent)
                    committed += orjson.loads(payload)["events"]

        # Warm-up at full load: table creation and the JVM's JIT compilation of the job's hot
        # paths take the first minute; the figures below are for the steady state after it.
        warm_start = time.monotonic()
        warm_end = warm_start + warmup_s
        await asyncio.gather(*(one(i, warm_start, warm_end) for i in range(producers)))
        say(f"  warm-up: {committed / max(warmup_s, 1e-9):,.0f} events/s committed, p50 {statistics.median(latencies) if latencies else float('nan'):.2f}s (not counted)")
        committed = 0
        latencies.clear()
        opened = await asyncio.to_thread(take_sample)
        start = time.monotonic()
        end = start + seconds
        progress = asyncio.create_task(report_progress(lambda: committed, start, end))
        await asyncio.gather(*(one(i, start, end) for i in range(producers)))
        progress.cancel()
        closed = await asyncio.to_thread(take_sample)
    return committed, latencies, failures, opened, closed


async def report_progress(count, start: float, end: float) -> None:  # noqa: ANN001
    while True:
        await asyncio.sleep(10)
        elapsed = time.monotonic() - start
        say(f"  {elapsed:5.0f}s / {end - start:.0f}s: {count():,} events committed ({count() / elapsed:,.0f}/s)")


def baseline(bodies: list[bytes], work_dir: Path, batches: int) -> float:
    """Events/s of pyarrow parse + Parquet write + pyiceberg append in one process."""
    catalog = SqlCatalog("bench", uri=f"sqlite:///{work_dir / 'baseline.db'}", warehouse=(work_dir / "wh").as_uri())
    catalog.create_namespace("bench")
    per_batch = 100  # requests per append, like one writer batch
    first = pajson.read_json(io.BytesIO(b"\n".join(bodies[:per_batch])))
    table = catalog.create_table(("bench", "logs"), schema=first.schema)
    events = 0
    started = time.perf_counter()
    for b in range(batches):
        chunk = [bodies[(b * per_batch + i) % len(bodies)] for i in range(per_batch)]
        arrow = pajson.read_json(io.BytesIO(b"\n".join(chunk)), parse_options=pajson.ParseOptions(explicit_schema=first.schema))
        table.append(arrow)
        events += arrow.num_rows
    return events / (time.perf_counter() - started)


def measure(shape: str, port: int, bodies: list[bytes], seconds: float, producers: int, warmup_s: float, take_sample) -> dict:  # noqa: ANN001
    size = statistics.mean(len(line) for line in bodies[0].split(b"\n"))
    path = shape_path(port, shape)
    say(f"shape {shape}: {producers} producers, {EVENTS_PER_REQUEST}-event NDJSON requests of ~{size:.0f}-byte events to {path}, wait=true, "
        f"{seconds:.0f}s (+{warmup_s:.0f}s warm-up)")
    committed, latencies, failures, opened, closed = asyncio.run(produce(port, path, bodies, seconds, producers, warmup_s, take_sample))
    rate = committed / seconds
    p50 = statistics.median(latencies) if latencies else float("nan")
    p99 = statistics.quantiles(latencies, n=100)[98] if len(latencies) >= 2 else float("nan")
    say(f"calve, {shape}: {rate:,.0f} events/s committed; wait=true ack p50 {p50:.2f}s p99 {p99:.2f}s; {failures} non-200 answers")
    profile = breakdown(opened, closed, committed)
    say("where the cores went in the measured window:\n" + table(profile))
    return {"events_per_s": round(rate, 1), "ack_p50_s": round(p50, 3), "ack_p99_s": round(p99, 3), "failures": failures, **profile}


def main() -> None:
    seconds = float(os.environ.get("BENCH_SECONDS", "60"))
    producers = int(os.environ.get("BENCH_PRODUCERS", "150"))
    warmup_s = float(os.environ.get("BENCH_WARMUP_S", "60"))
    shape_warmup_s = float(os.environ.get("BENCH_SHAPE_WARMUP_S", "20"))
    shapes = [name.strip() for name in os.environ.get("BENCH_SHAPES", "plain,extra,declared,processors").split(",") if name.strip()]
    unknown = [name for name in shapes if name not in SHAPES]
    if unknown:
        raise SystemExit(f"BENCH_SHAPES: no shape {unknown}; the shapes are {', '.join(SHAPES)}")
    bodies = {shape: make_bodies(200, shape) for shape in shapes}
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="calve-bench-") as tmp:
        work = Path(tmp)
        port = free_port()
        say(f"starting the embedded stack (data in {work}) ...")
        data_dir = work / "data"
        data_dir.mkdir()
        seaweed = None
        if os.environ.get("BENCH_WAREHOUSE") == "seaweedfs":
            from tests.harness import SeaweedServer

            (work / "seaweed").mkdir()
            seaweed = SeaweedServer(work / "seaweed").start()
            os.environ.update(seaweed.overrides(seaweed.new_bucket("calve-bench")))
            say(f"warehouse: SeaweedFS's S3 ({seaweed.s3_endpoint}), REST catalog {seaweed.catalog_uri}")
        stack = start_stack(data_dir, port)
        operator = operator_token(data_dir)
        try:
            for index, shape in enumerate(shapes):
                results[shape] = measure(shape, port, bodies[shape], seconds, producers, warmup_s if index == 0 else shape_warmup_s,
                                         lambda: sample(stack.pid, port, operator))
        finally:
            stack.send_signal(signal.SIGTERM)
            stack.wait(120)
            if seaweed is not None:
                seaweed.stop()
        say("baseline: pyarrow parse + Parquet + pyiceberg append, one process ...")
        base = baseline(bodies[shapes[0]], work, batches=20)
        say(f"baseline: {base:,.0f} events/s")
    first = results[shapes[0]]
    reference = results.get("plain", first)["events_per_s"]
    for shape, result in results.items():
        result["vs_plain"] = round(result["events_per_s"] / reference, 3) if reference else None
        say(f"  {shape:<8} {result['events_per_s']:>10,.0f} events/s  {result['vs_plain']:.2f}x plain  p50 {result['ack_p50_s']:.2f}s p99 {result['ack_p99_s']:.2f}s  "
            f"{result['cpu_s_per_100k_all_roles']} CPU-s/100k (all roles)")
    print(orjson.dumps({
        **first,
        "baseline_events_per_s": round(base, 1),
        "ratio": round(first["events_per_s"] / base, 3) if base else None,
        "shapes": results,
    }).decode(), flush=True)


if __name__ == "__main__":
    main()
