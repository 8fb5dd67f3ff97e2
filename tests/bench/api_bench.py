"""`make bench-api`: the api's own CPU per request, shape by shape, with nothing after it.

Starts a redis-server and one api process (no writer, committer or Spark), then for each shape
(BENCH_SHAPES, the names `make bench` uses: plain, otlp, ... ; default plain,extra,nested,otlp,
otlp-proto,loki,bulk) lets BENCH_PRODUCERS (50) connections POST `make bench`'s 1,000-event bodies
with wait=false for BENCH_SECONDS (15) after BENCH_WARMUP_S (3), and reports the api process's CPU
per request and per event, measured in that process (psutil). `make bench` sees the api only
through a whole stack's noise; this is where a change to how the api reads a body is measured.
The stack's input stream is trimmed as it goes (nothing commits it), so memory stays bounded.
The last line of output is one JSON object.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson
import psutil
import redis

from tests.bench.ingest_bench import EVENTS_PER_REQUEST, PROTOCOLS, make_bodies, say, shape_path
from tests.harness import TEST_TOKEN, RedisServer, build_stack

DEFAULT_SHAPES = "plain,extra,nested,otlp,otlp-proto,loki,bulk"


async def load(url: str, content_type: str, bodies: list[bytes], producers: int, seconds: float) -> tuple[int, int]:
    """(requests answered 2xx, other answers) in `seconds`."""
    done = failed = 0
    headers = {"Authorization": f"Bearer {TEST_TOKEN}", "Content-Type": content_type}
    connector = aiohttp.TCPConnector(limit=producers)
    async with aiohttp.ClientSession(connector=connector, headers=headers, timeout=aiohttp.ClientTimeout(total=60)) as client:

        async def one(index: int, until: float) -> None:
            nonlocal done, failed
            k = index
            while time.monotonic() < until:
                async with client.post(url, data=bodies[k % len(bodies)]) as answer:
                    await answer.read()
                    if answer.status in (200, 202, 204):
                        done += 1
                    else:
                        failed += 1
                k += producers

        until = time.monotonic() + seconds
        await asyncio.gather(*(one(i, until) for i in range(producers)))
    return done, failed


def trim(client: redis.Redis) -> None:
    """Drop what the input streams hold (no writer reads them here)."""
    for key in client.scan_iter(match="*", count=1000, _type="stream"):
        client.xtrim(key, maxlen=0)


def main() -> None:
    shapes = [s for s in os.environ.get("BENCH_SHAPES", DEFAULT_SHAPES).split(",") if s]
    producers = int(os.environ.get("BENCH_PRODUCERS", "50"))
    seconds = float(os.environ.get("BENCH_SECONDS", "15"))
    warmup_s = float(os.environ.get("BENCH_WARMUP_S", "3"))
    results = {}
    with tempfile.TemporaryDirectory(prefix="calve-bench-api-") as tmp:
        base = Path(tmp)
        (base / "redis").mkdir()
        server = RedisServer(base / "redis").start()
        client = redis.Redis.from_url(server.url)
        # Limits out of the way: the api's work is measured, not its refusals.
        stack = build_stack(base / "data", server.url, "sc://127.0.0.1:1", client, roles=("api",),
                            CALVE_MAX_EVENTS_PER_S="100000000", CALVE_MAX_BYTES_PER_S="100000000000",
                            CALVE_MAX_BACKLOG_EVENTS="1000000000")
        try:
            api = psutil.Process(stack.procs["api"].pid)
            for shape in shapes:
                bodies = make_bodies(20, shape)
                path = shape_path(stack.port, shape, TEST_TOKEN)
                _path, content_type, can_wait = PROTOCOLS.get(shape, (None, "application/x-ndjson", True))
                url = f"{stack.url}{path}" + ("?wait=false" if can_wait else "")
                asyncio.run(load(url, content_type, bodies, producers, warmup_s))
                trim(client)
                cpu = api.cpu_times()
                start = time.monotonic()
                done, failed = asyncio.run(load(url, content_type, bodies, producers, seconds))
                elapsed = time.monotonic() - start
                after = api.cpu_times()
                trim(client)
                used = (after.user - cpu.user) + (after.system - cpu.system)
                per_request_ms = 1000 * used / max(done, 1)
                results[shape] = {"requests_per_s": round(done / elapsed, 1), "failed": failed, "api_cpu_ms_per_request": round(per_request_ms, 3),
                                  "api_cpu_us_per_event": round(1000 * per_request_ms / EVENTS_PER_REQUEST, 2),
                                  "bytes_per_event": round(sum(map(len, bodies)) / len(bodies) / EVENTS_PER_REQUEST)}
                say(f"  {shape:<11} {done / elapsed:8,.1f} requests/s  {per_request_ms:6.2f} ms of api CPU a request "
                    f"({results[shape]['api_cpu_us_per_event']:.2f} us an event, {results[shape]['bytes_per_event']} bytes)"
                    + (f"  {failed} failed" if failed else ""))
        finally:
            stack.stop()
            server.stop()
    print(orjson.dumps(results).decode(), flush=True)


if __name__ == "__main__":
    main()
