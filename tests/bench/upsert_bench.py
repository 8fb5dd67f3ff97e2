"""`make bench-upsert`: row changes against a 1,000,000-row table partitioned by day, in each
write mode (merge-on-read, then copy-on-write), in one run.

Starts `calve up` on a fresh data directory; per mode, loads BENCH_ROWS rows (ids 0..N-1, spread
over 30 days, id order = day order) through an append pipeline into a table of its own whose
identifier is `id`, then lets producers POST upserts with wait=true for BENCH_SECONDS: each
request changes 1,000 keys of the most recent 7 days (1% of the table every ten requests). It
reports changed rows per second, wait=true p50/p99, and write amplification: rows written by the
overwrite snapshots (new rows, rows of rewritten files, new position deletes) per row changed,
and, apart, the earlier positions a merge-on-read run copies into the one delete file it keeps per
data file (row_delta_job.py). Then it times full reads by pyiceberg and by DuckDB's iceberg
extension, best of three: of the table as loaded, before any change (for reference), and, once a
compaction asked for by hand (which folds every delete file in) is over and the stack is quiet,
of the table as the run left it (its snapshot then), of the compacted table, and of
two copies of the same rows that never changed as baselines: one partitioned by day as the table
is, a file a day, zstd as Calve writes (what the compacted table should read like), and one
unpartitioned (appended by pyiceberg). The table as left is timed by pyiceberg once more with its
position deletes applied as upstream's open fix would (iceberg-python #1271: the positions' range
built by numpy, not a Python `range`), to tell pyiceberg's share of its time. The last line is one
JSON object, by mode.

Knobs (environment): BENCH_ROWS (1000000), BENCH_SECONDS (60), BENCH_PRODUCERS (4),
BENCH_WRITE_MODES (merge-on-read,copy-on-write), BENCH_APPEND_SECONDS (20: appends to the same
table alone, then as long again while the changes flow, each p50 reported).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime
import itertools
import os
import random
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import httpx
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.manifest import ManifestContent

from service.iceberg.rewrites import live_files
from tests.bench.ingest_bench import TOKEN, compact_by_hand, embedded_stack, say, stack_catalog

DAYS = 30
RECENT_DAYS = 7
PER_REQUEST = 1000
APPENDERS, APPEND_ROWS = 2, 100  # appends to the same table, alone and while changes flow
START = datetime.datetime(2026, 10, 1, tzinfo=datetime.timezone.utc)
SCHEMA = {"columns": [
    {"name": "id", "type": "long", "required": True}, {"name": "ts", "type": "timestamptz", "required": True},
    {"name": "balance", "type": "long"}, {"name": "name", "type": "string"},
], "partition_spec": [{"column": "ts", "transform": "day"}]}


def row(key: int, rows: int, balance: int) -> dict:
    day = key * DAYS // rows
    ts = START + datetime.timedelta(days=day, seconds=key % 86400)
    return {"id": key, "ts": ts.isoformat(), "balance": balance, "name": f"account-{key:07d}"}


def table_name(write_mode: str) -> str:
    return "accounts_" + write_mode.split("-")[0]  # accounts_merge, accounts_copy


def setup(port: int, rows: int, write_mode: str) -> None:
    name = table_name(write_mode)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=600) as http:
        # The upsert sink creates the table (with id as its identifier field) ...
        answer = http.post("/v1/pipelines", json={
            "name": name, "source": {"http": {"path": f"/{name}"}},
            "sinks": [{"table": name, "auto_create": True, "schema": SCHEMA, "identifier_columns": ["id"], "mode": "upsert",
                       "write_mode": write_mode}],
        })
        assert answer.status_code == 201, answer.text
        first = http.post(f"/{name}?wait=true&timeout=300", content=orjson.dumps(row(0, rows, 0)))
        assert first.status_code == 200, first.text
        # ... and the rest is appended, 20,000 rows a request.
        answer = http.post("/v1/pipelines", json={
            "name": f"{name}_load", "source": {"http": {"path": f"/{name}_load"}}, "sinks": [{"table": name}],
        })
        assert answer.status_code == 201, answer.text
        started = time.monotonic()
        for start in range(1, rows, 20_000):
            body = b"\n".join(orjson.dumps(row(k, rows, 0)) for k in range(start, min(rows, start + 20_000)))
            answer = http.post(f"/{name}_load?wait=true&timeout=600", content=body, headers={"Content-Type": "application/x-ndjson"})
            assert answer.status_code == 200, answer.text
        say(f"{write_mode}: loaded {rows:,} rows in {time.monotonic() - started:.0f} s")


async def upsert(port: int, rows: int, seconds: float, producers: int, name: str) -> tuple[int, list[float], int]:
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/x-ndjson"}
    url = f"http://127.0.0.1:{port}/{name}?wait=true&timeout=300"
    recent = rows - rows * RECENT_DAYS // DAYS
    changed, latencies, failures = 0, [], 0
    rng = random.Random(7)
    if not producers:
        await asyncio.sleep(seconds)
        return changed, latencies, failures
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
                    if failures <= 3:
                        say(f"a request answered {answer.status}: {payload[:300]!r}")
                    continue
                latencies.append(time.monotonic() - sent)
                changed += orjson.loads(payload)["tables"][name]["changes"]["updated"]

        until = time.monotonic() + seconds
        await asyncio.gather(*(one(until) for _ in range(producers)))
    return changed, latencies, failures


async def append(port: int, rows: int, seconds: float, producers: int, name: str, first_key: int) -> list[float]:
    """Appenders beside the changes: `producers` loops of APPEND_ROWS new rows (new keys, from
    `first_key` on, in the days the changes hit) through the table's append pipeline, wait=true;
    their latencies."""
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/x-ndjson"}
    url = f"http://127.0.0.1:{port}/{name}_load?wait=true&timeout=300"
    recent = rows - rows * RECENT_DAYS // DAYS
    latencies: list[float] = []
    keys = itertools.count(first_key)
    async with aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=600)) as client:

        async def one(until: float) -> None:
            while time.monotonic() < until:
                body = b"\n".join(orjson.dumps({**row(recent + key % (rows - recent), rows, 0), "id": key})
                                  for key in itertools.islice(keys, APPEND_ROWS))
                sent = time.monotonic()
                async with client.post(url, data=body) as answer:
                    await answer.read()
                if answer.status == 200:
                    latencies.append(time.monotonic() - sent)

        until = time.monotonic() + seconds
        await asyncio.gather(*(one(until) for _ in range(producers)))
    return latencies


async def beside(port: int, rows: int, seconds: float, producers: int, name: str, first_key: int) -> tuple[list[float], int]:
    """Appends while `producers` change rows (none: appends alone): (append latencies, rows changed)."""
    appended, (changed, _latencies, _failures) = await asyncio.gather(
        append(port, rows, seconds, APPENDERS, name, first_key), upsert(port, rows, seconds, producers, name),
    )
    return appended, changed


def amplification(data_dir: Path, name: str, since_ms: int) -> tuple[int, int, int, int]:
    """(rows written, files rewritten, delete files written, earlier positions copied) by the
    overwrite snapshots committed since `since_ms`: rows and new position deletes both count as
    rows written; the positions of the delete files a run replaces, which its own delete file
    holds again, are counted apart."""
    catalog = stack_catalog(data_dir)
    table = catalog.load_table(("demo", name))
    written = rewritten = delete_files = copied = 0
    for snapshot in table.snapshots():
        if snapshot.timestamp_ms >= since_ms and snapshot.summary and snapshot.summary.operation.value == "overwrite":
            summary = snapshot.summary.additional_properties
            again = int(summary.get("removed-position-deletes", 0))
            written += int(summary.get("added-records", 0)) + int(summary.get("added-position-deletes", 0)) - again
            copied += again
            rewritten += int(summary.get("deleted-data-files", 0))
            delete_files += int(summary.get("added-position-delete-files", 0))
    return written, rewritten, delete_files, copied


def read_seconds(table, snapshot_id: int | None = None) -> tuple[float, float, int]:  # noqa: ANN001 - a pyiceberg Table
    """(pyiceberg's, DuckDB's) seconds for a full read of `table` (as of `snapshot_id`), best of
    three, and its rows."""
    from tests.harness import duckdb_iceberg

    connection = duckdb_iceberg()
    snapshot_id = snapshot_id or table.current_snapshot().snapshot_id
    py = duck = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        rows = table.scan(snapshot_id=snapshot_id).to_arrow().num_rows
        py = min(py, time.perf_counter() - started)
        started = time.perf_counter()
        duck_rows = connection.execute("SELECT * FROM iceberg_scan(?, snapshot_from_id=?)", [table.metadata_location, snapshot_id]).to_arrow_table().num_rows
        duck = min(duck, time.perf_counter() - started)
    assert rows == duck_rows, f"pyiceberg read {rows} rows, DuckDB {duck_rows}"
    return py, duck, rows


@contextlib.contextmanager
def range_fixed() -> Iterator[None]:
    """pyiceberg's `_combine_positional_deletes` building the positions' range by numpy, as
    upstream's open fix of iceberg-python #1271 would (0.12 builds a Python `range`, ~4 ms a
    33,000-row file), for the block: what is left of a read's time is the table's shape, not that."""
    import numpy as np
    import pyiceberg.io.pyarrow as pyiceberg_arrow

    def combined(deletes: list[pa.ChunkedArray], start: int, end: int) -> pa.Array:
        positions = deletes[0] if len(deletes) == 1 else pa.chunked_array(itertools.chain(*[d.chunks for d in deletes]))
        every = pa.array(np.arange(start, end, dtype=np.int64))
        return pc.subtract(pc.filter(every, pc.invert(pc.is_in(every, value_set=positions))), pa.scalar(start))

    original, pyiceberg_arrow._combine_positional_deletes = pyiceberg_arrow._combine_positional_deletes, combined
    try:
        yield
    finally:
        pyiceberg_arrow._combine_positional_deletes = original


def shape_of(table) -> dict:  # noqa: ANN001 - a pyiceberg Table
    """What a full read opens: data files, delete files, manifests."""
    data, deletes = live_files(table)
    manifests = table.current_snapshot().manifests(table.io)
    per_day = sorted(collections.Counter(file.partition for file in data.values()).values())
    return {"snapshot_id": table.current_snapshot().snapshot_id, "data_files": len(data), "delete_files": len(deletes), "manifests": len(manifests),
            "delete_manifests": sum(manifest.content == ManifestContent.DELETES for manifest in manifests),
            "files_a_day_max": per_day[-1] if per_day else 0, "days_of_one_file": per_day.count(1)}


def loaded_read(data_dir: Path, name: str) -> dict:
    """Full-read times of the table as loaded, before any row change: what its files cost a
    reader before any delete file (the load leaves a few files per day, which the compaction by
    hand below merges too)."""
    catalog = stack_catalog(data_dir)
    table = catalog.load_table(("demo", name))
    py, duck, _rows = read_seconds(table)
    return {"pyiceberg_s": round(py, 3), "duckdb_s": round(duck, 3), "shape": shape_of(table)}


def settle(data_dir: Path, name: str, timeout_s: float = 180) -> None:
    """Wait until the days no change will touch are merged into a file each (cold partitions:
    compaction.py), as they are in a table older than the bench's minute."""
    catalog = stack_catalog(data_dir)
    started = time.monotonic()
    while (settled := shape_of(catalog.load_table(("demo", name)))["days_of_one_file"]) < DAYS - RECENT_DAYS:
        if time.monotonic() - started > timeout_s:
            say(f"{name}: {settled} of its {DAYS - RECENT_DAYS} older days merged into one file after {timeout_s:.0f} s; going on")
            return
        time.sleep(2)
    say(f"{name}: its older days merged, a file each, in {time.monotonic() - started:.0f} s")


def reads(data_dir: Path, port: int, name: str) -> dict:
    """Full-read times of the table as the changes left it and after a compaction by hand, and of
    two copies of the rows, all timed once the compaction is over: the stack still runs upkeep
    after the last change, and a read beside it would time the machine's other work too."""
    catalog = stack_catalog(data_dir)
    left = catalog.load_table(("demo", name))
    left_snapshot = left.current_snapshot().snapshot_id
    shape = {"before": shape_of(left)}
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=900) as http:
        asked = compact_by_hand(http, name)
        assert asked.status_code == 200, f"the compaction by hand answered {asked.status_code}: {asked.text[:300]}"
        answer = asked.json()
        health = http.get(f"/v1/tables/{name}").json()["health"]
    table = catalog.load_table(("demo", name))
    before = read_seconds(table, left_snapshot)
    with range_fixed():
        fixed = read_seconds(table, left_snapshot)
    after = read_seconds(table)
    shape["after"] = shape_of(table)
    catalog.create_namespace_if_not_exists("bench")
    rows = table.scan().to_arrow()
    # Unpartitioned: pyiceberg writes partitioned tables only with pyiceberg-core, which Calve does not install.
    plain = catalog.create_table(("bench", f"{name}_plain"), table.schema(), properties={"format-version": "2"})
    plain.append(rows)
    baseline = read_seconds(plain)
    daily = read_seconds(daily_copy(catalog, table, rows, f"{name}_daily"))
    assert before[2] == after[2] == baseline[2] == daily[2], (before, after, baseline, daily)
    return {
        "compaction": answer["tasks"]["compact"].get("outcome"), "delete_files_after": health["delete_files"], "shape": shape,
        "pyiceberg_s": {"before": round(before[0], 3), "before_range_fixed": round(fixed[0], 3), "after": round(after[0], 3), "plain": round(baseline[0], 3), "daily": round(daily[0], 3)},
        "duckdb_s": {"before": round(before[1], 3), "after": round(after[1], 3), "plain": round(baseline[1], 3), "daily": round(daily[1], 3)},
    }


def daily_copy(catalog, table, rows: pa.Table, name: str):  # noqa: ANN001, ANN201 - pyiceberg's Catalog and Table
    """A copy of `rows` partitioned by day as `table` is, one file per day, never changed: what the
    table would read like had its rows arrived as they are now (files written by pyarrow, one a
    day, and added: pyiceberg writes partitioned tables only with pyiceberg-core). In zstd, as
    Calve writes every file: pyarrow's default, snappy, reads 7-10% faster in DuckDB (and is ~50%
    larger), which once passed for what a compaction leaves."""
    copy = catalog.create_table(("bench", name), table.schema(), partition_spec=table.spec(), properties={"format-version": "2"})
    rows = rows.cast(pa.schema([pa.field(field.name, field.type, field.nullable) for field in rows.schema]))  # no field ids
    days = pc.cast(rows["ts"], pa.date32())
    root = Path(copy.location().removeprefix("file://")) / "data"
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for day in pc.unique(days).to_pylist():
        pq.write_table(rows.filter(pc.equal(days, pa.scalar(day, pa.date32()))), root / f"{day}.parquet", compression="zstd")
        paths.append((root / f"{day}.parquet").as_uri())
    copy.add_files(paths)
    return catalog.load_table(("bench", name))


def main() -> None:
    rows = int(os.environ.get("BENCH_ROWS", "1000000"))
    seconds = float(os.environ.get("BENCH_SECONDS", "60"))
    producers = int(os.environ.get("BENCH_PRODUCERS", "4"))
    modes = os.environ.get("BENCH_WRITE_MODES", "merge-on-read,copy-on-write").split(",")
    append_seconds = float(os.environ.get("BENCH_APPEND_SECONDS", "20"))
    os.environ.setdefault("CALVE_SNAPSHOT_MAX_AGE_S", "86400")  # keep the measured window's snapshots
    os.environ.setdefault("CALVE_SNAPSHOT_MAX_COUNT", "100000")
    # The load puts 30 days in the table within a minute; in a table of that age the 23 days no
    # change touches would have been cold for weeks, and merged (compaction.py): so they are here,
    # before the changes start (settle), not during them.
    os.environ.setdefault("CALVE_COMPACT_COLD_AFTER_S", "5")
    results = {}
    with embedded_stack("calve-upsert-") as (data_dir, port):
        for write_mode in modes:
            setup(port, rows, write_mode)
            loaded = loaded_read(data_dir, table_name(write_mode))
            settle(data_dir, table_name(write_mode))
            say(f"{write_mode}: {producers} producers, {PER_REQUEST}-key upserts over the last {RECENT_DAYS} days, wait=true, "
                f"{seconds:.0f} s")
            since_ms = int(time.time() * 1000)
            changed, latencies, failures = asyncio.run(upsert(port, rows, seconds, producers, table_name(write_mode)))
            written, files, delete_files, copied = amplification(data_dir, table_name(write_mode), since_ms)
            p50 = statistics.median(latencies) if latencies else float("nan")
            p99 = statistics.quantiles(latencies, n=100)[98] if len(latencies) >= 2 else float("nan")
            say(f"{write_mode}: {changed / seconds:,.0f} changed rows/s; wait=true p50 {p50:.2f}s p99 {p99:.2f}s; "
                f"{written:,} rows written for {changed:,} changed ({files} files rewritten, {delete_files} delete files, "
                f"{copied:,} earlier positions copied into them); "
                f"{failures} non-200 answers")
            results[write_mode] = {
                "changed_rows_per_s": round(changed / seconds, 1), "ack_p50_s": round(p50, 3), "ack_p99_s": round(p99, 3),
                "write_amplification": round(written / changed, 2) if changed else None, "files_rewritten": files,
                "delete_files": delete_files, "positions_copied_per_row_changed": round(copied / changed, 2) if changed else None,
                "non_200": failures,
            }
            results[write_mode]["reads"] = timed = {**reads(data_dir, port, table_name(write_mode)), "loaded": loaded}
            say(f"{write_mode}: full read, pyiceberg / DuckDB: {timed['pyiceberg_s']['before']:.2f} / {timed['duckdb_s']['before']:.2f} s "
                f"as left ({timed['shape']['before']}; pyiceberg {timed['pyiceberg_s']['before_range_fixed']:.2f} s with iceberg-python #1271 fixed), {timed['pyiceberg_s']['after']:.2f} / {timed['duckdb_s']['after']:.2f} s after compaction "
                f"({timed['compaction']}, {timed['shape']['after']}), "
                f"{timed['pyiceberg_s']['daily']:.2f} / {timed['duckdb_s']['daily']:.2f} s for a copy never changed, a file a day, "
                f"{timed['pyiceberg_s']['plain']:.2f} / {timed['duckdb_s']['plain']:.2f} s unpartitioned; "
                f"{loaded['pyiceberg_s']:.2f} / {loaded['duckdb_s']:.2f} s as loaded, before any change ({loaded['shape']})")
            # Appends to the same table, alone, then while the same producers change rows.
            alone, _ = asyncio.run(beside(port, rows, append_seconds, 0, table_name(write_mode), 10 * rows))
            during, changed_beside = asyncio.run(beside(port, rows, append_seconds, producers, table_name(write_mode), 20 * rows))
            appends = {"alone_p50_s": round(statistics.median(alone), 3), "during_changes_p50_s": round(statistics.median(during), 3),
                       "changed_rows_per_s_beside": round(changed_beside / append_seconds, 1)}
            appends["ratio"] = round(appends["during_changes_p50_s"] / appends["alone_p50_s"], 2)
            results[write_mode]["appends"] = appends
            say(f"{write_mode}: appends of {APPEND_ROWS} rows by {APPENDERS} producers, wait=true p50: {appends['alone_p50_s']:.2f} s alone, "
                f"{appends['during_changes_p50_s']:.2f} s while changes flow ({appends['ratio']:.2f}x; "
                f"{appends['changed_rows_per_s_beside']:,.0f} changed rows/s meanwhile)")
    print(orjson.dumps({"table_rows": rows, **results}).decode(), flush=True)


if __name__ == "__main__":
    main()
