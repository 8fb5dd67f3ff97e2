"""`make soak`: the embedded stack under steady wait=true load for thousands of commits, upkeep on.

Starts `calve up` on a fresh data directory with a short commit interval and a short upkeep
interval, lets producers POST small NDJSON requests with wait=true until the table has had
SOAK_COMMITS commits, and prints at the start and every SOAK_EVERY commits: commit duration
p50/p99 (from the committer's log), wait=true p50/p99, and the table's snapshots, manifests,
metadata.json bytes, data files and average data file bytes (its health). Then it reads the table
back and checks that every acknowledged event is there exactly once. The last line is one JSON
object with the figures at the start (the first 100 commits) and at the end (the last 100).

Knobs (environment): SOAK_COMMITS (3600), SOAK_EVERY (300), SOAK_PRODUCERS (8),
SOAK_EVENTS_PER_REQUEST (50), and any CALVE_* setting (defaults below).
"""

from __future__ import annotations

import asyncio
import collections
import os
import re
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp
import httpx
import orjson

from service.cli.processes import free_port
from tests.bench.ingest_bench import TOKEN, make_event, say, stack_catalog, start_stack

COMMIT_LINE = re.compile(rb"committed demo\.logs snapshot \d+: .* in ([0-9.]+) s")
SOAK_SETTINGS = {
    "CALVE_COMMIT_INTERVAL_S": "0.05",
    "CALVE_WRITER_BATCH_WAIT_S": "0.05",
    "CALVE_UPKEEP_INTERVAL_S": "10",
    "CALVE_LOG_LEVEL": "INFO",
}


def quantiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return (values[0], values[0]) if values else (float("nan"), float("nan"))
    cuts = statistics.quantiles(values, n=100)
    return cuts[49], cuts[98]


class Soak:
    def __init__(self, port: int, log: Path, producers: int, per_request: int) -> None:
        self.port = port
        self.log = log
        self.producers = producers
        self.per_request = per_request
        self.acked: list[tuple[int, int]] = []  # (producer, request number) acknowledged as committed
        self.latencies: list[tuple[float, float]] = []  # (answered at, seconds)
        self.failures = 0

    def commit_seconds(self) -> list[float]:
        return [float(match.group(1)) for match in COMMIT_LINE.finditer(self.log.read_bytes())]

    def health(self) -> dict:
        answer = httpx.get(f"http://127.0.0.1:{self.port}/v1/tables/logs", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
        return answer.json()["health"] if answer.status_code == 200 else {}

    def figures(self, commits: list[float], since: float) -> dict:
        commit_p50, commit_p99 = quantiles(commits)
        acks = [seconds for at, seconds in self.latencies if at >= since]
        ack_p50, ack_p99 = quantiles(acks)
        health = self.health()
        return {
            "commits": len(self.commit_seconds()),
            "commit_p50_s": round(commit_p50, 4), "commit_p99_s": round(commit_p99, 4),
            "ack_p50_s": round(ack_p50, 3), "ack_p99_s": round(ack_p99, 3),
            **{key: health.get(key) for key in ("snapshots", "manifests", "metadata_bytes", "data_files", "avg_file_bytes")},
        }

    async def produce(self, index: int, stop: asyncio.Event, client: aiohttp.ClientSession) -> None:
        url = f"http://127.0.0.1:{self.port}/logs?wait=true&timeout=120"
        number = 0
        while not stop.is_set():
            body = b"\n".join(
                orjson.dumps(make_event(i) | {"id": f"{index}-{number}-{i}"}) for i in range(self.per_request)
            )
            sent = time.monotonic()
            try:
                async with client.post(url, data=body) as answer:
                    status = answer.status
                    await answer.read()
            except aiohttp.ClientError:
                self.failures += 1
                continue
            if status == 200:
                self.acked.append((index, number))
                self.latencies.append((time.monotonic(), time.monotonic() - sent))
            else:
                self.failures += 1
            number += 1

    async def run(self, commits: int, every: int) -> tuple[dict, dict, list[str]]:
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/x-ndjson"}
        stop = asyncio.Event()
        lines: list[str] = []
        async with aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=180)) as client:
            tasks = [asyncio.create_task(self.produce(i, stop, client)) for i in range(self.producers)]
            started = time.monotonic()
            start_figures: dict = {}
            reported, window_start = 0, time.monotonic()
            while True:
                await asyncio.sleep(2)
                seconds = self.commit_seconds()
                if not start_figures and len(seconds) >= 100:
                    start_figures = await asyncio.to_thread(self.figures, seconds[:100], started)
                    say(f"start (first 100 commits): {start_figures}")
                if len(seconds) >= reported + every or len(seconds) >= commits:
                    reported = len(seconds)
                    now = await asyncio.to_thread(self.figures, seconds[-100:], window_start)
                    window_start = time.monotonic()
                    say(f"{time.monotonic() - started:6.0f}s: {now}")
                    lines.append(orjson.dumps(now).decode())
                if len(seconds) >= commits:
                    break
            stop.set()
            await asyncio.gather(*tasks)
        end_figures = await asyncio.to_thread(self.figures, self.commit_seconds()[-100:], window_start)
        return start_figures, end_figures, lines


def check_exactly_once(data_dir: Path, acked: list[tuple[int, int]], per_request: int) -> tuple[int, int]:
    """(acknowledged events missing, events duplicated) in the table as read back."""
    catalog = stack_catalog(data_dir)
    ids = catalog.load_table(("demo", "logs")).scan(selected_fields=("id",)).to_arrow().column("id").to_pylist()
    counts = collections.Counter(ids)
    duplicated = sum(count - 1 for count in counts.values() if count > 1)
    missing = sum(1 for producer, number in acked for i in range(per_request) if f"{producer}-{number}-{i}" not in counts)
    return missing, duplicated


def main() -> None:
    commits = int(os.environ.get("SOAK_COMMITS", "3600"))
    every = int(os.environ.get("SOAK_EVERY", "300"))
    producers = int(os.environ.get("SOAK_PRODUCERS", "8"))
    per_request = int(os.environ.get("SOAK_EVENTS_PER_REQUEST", "50"))
    for key, value in SOAK_SETTINGS.items():
        os.environ.setdefault(key, value)
    with tempfile.TemporaryDirectory(prefix="calve-soak-") as tmp:
        data_dir = Path(tmp) / "data"
        data_dir.mkdir()
        port = free_port()
        say(f"starting the embedded stack (data in {data_dir}); {producers} producers of {per_request}-event requests, "
            f"wait=true, until {commits} commits")
        stack = start_stack(data_dir, port)
        try:
            soak = Soak(port, data_dir / "calve-up.log", producers, per_request)
            start, end, _lines = asyncio.run(soak.run(commits, every))
        finally:
            stack.terminate()
            stack.wait(120)
        missing, duplicated = check_exactly_once(data_dir, soak.acked, per_request)
        say(f"read back: {len(soak.acked) * per_request} events acknowledged, {missing} missing, {duplicated} duplicated; "
            f"{soak.failures} non-200 answers")
    ratio = end["commit_p50_s"] / start["commit_p50_s"] if start.get("commit_p50_s") else None
    print(orjson.dumps({
        "start": start, "end": end, "commit_p50_end_over_start": round(ratio, 2) if ratio else None,
        "acknowledged_events": len(soak.acked) * per_request, "lost": missing, "duplicated": duplicated,
        "non_200": soak.failures,
    }).decode(), flush=True)


if __name__ == "__main__":
    main()
