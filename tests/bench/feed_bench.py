"""`make bench-feed`: the change feed of a 1% update of a 1,000,000-row table, and where its time goes.

Builds a BENCH_ROWS-row table (ids 0..N-1, BENCH_FILES data files, identifier `id`) in a SQLite
catalog with pyiceberg, then commits one copy-on-write snapshot that changes 1% of the rows spread
over every file (each file rewritten whole, as Calve's row changes do), and reads that snapshot's
changes the way the api does: planning (the first pass: read and hash every row of the removed and
added files), the rows (the second pass: read again, drop carryover, label updates), and the
NDJSON encoding; then the same through the api (GET /v1/tables/{name}/changes, in-process app).
Reports changed rows per second for each; the last line is one JSON object.

Knobs (environment): BENCH_ROWS (1000000), BENCH_FILES (8), BENCH_CHANGED (0.01).
"""

from __future__ import annotations

import os
import random
import tempfile
import time
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.schema import Schema
from pyiceberg.types import DoubleType, LongType, NestedField, StringType

from service.core.config import Settings
from service.iceberg.catalog import open_catalog
from service.iceberg.changelog import Changelog, lineage, snapshot_files
from service.iceberg.rewrites import live_data_files, overwrite_files

ROWS = int(os.environ.get("BENCH_ROWS", 1_000_000))
FILES = int(os.environ.get("BENCH_FILES", 8))
CHANGED = float(os.environ.get("BENCH_CHANGED", 0.01))
ARROW = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string()), pa.field("balance", pa.float64())])


def say(message: str) -> None:
    print(f"bench-feed: {message}", flush=True)


def build(catalog: Catalog) -> tuple[Catalog, object, int]:
    catalog.create_namespace("demo")
    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "name", StringType()),
                    NestedField(3, "balance", DoubleType()), identifier_field_ids=[1])
    table = catalog.create_table(("demo", "accounts"), schema)
    per_file = ROWS // FILES
    with table.transaction() as transaction:
        for part in range(FILES):
            ids = pa.array(range(part * per_file, (part + 1) * per_file), pa.int64())
            transaction.append(pa.table({"id": ids, "name": pc.binary_join_element_wise("name-", pc.cast(ids, pa.string()), ""),
                                         "balance": pc.cast(ids, pa.float64())}, schema=ARROW))
    table = catalog.load_table(("demo", "accounts"))
    before = table.current_snapshot().snapshot_id
    # One copy-on-write snapshot: every file rewritten with CHANGED of its rows changed.
    rng = random.Random(7)
    removes, adds = sorted(live_data_files(table)), []
    for path in removes:
        data = pq.read_table(path.removeprefix("file://"))
        changed = pa.array([rng.random() < CHANGED for _ in range(data.num_rows)])
        balance = pc.if_else(changed, pc.add(data.column("balance"), 1.0), data.column("balance"))
        rewritten = data.set_column(2, "balance", balance)
        target = f"{table.location().removeprefix('file://')}/data/rewrite-{len(adds)}.parquet"
        pq.write_table(rewritten, target)
        adds.append(f"file://{target}")
    transaction = table.transaction()
    overwrite_files(table, transaction, removes, adds, {})
    transaction.commit_transaction()
    return catalog, catalog.load_table(("demo", "accounts")), before


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="calve-bench-feed-") as tmp:
        base = Path(tmp)
        settings = Settings(data_dir=base, catalog_uri=f"sqlite:///{base}/catalog.db", warehouse=f"file://{base}/warehouse")
        started = time.perf_counter()
        catalog, table, before = build(open_catalog(settings))
        say(f"{ROWS} rows in {FILES} files, one snapshot changing {CHANGED:.0%} of them ({time.perf_counter() - started:.1f} s to build)")
        snapshot = lineage(table, before)[0]
        changelog = Changelog(table)
        t0 = time.perf_counter()
        files = snapshot_files(table, snapshot)
        t1 = time.perf_counter()
        plan = changelog.plan(files)
        t2 = time.perf_counter()
        batches = list(changelog.rows(plan))
        t3 = time.perf_counter()
        encoded = sum(len(orjson.dumps(row, default=str)) for batch in batches for row in batch.to_pylist())
        t4 = time.perf_counter()
        changes = sum(batch.num_rows for batch in batches)
        read_rows = sum(part.file.record_count for part in files.removed + files.added)
        say(f"{changes} change rows ({changes // 2} keys updated) from {read_rows} rows in {len(files.removed)}+{len(files.added)} files")
        say(f"manifests {t1 - t0:.2f} s, first pass (hash every row) {t2 - t1:.2f} s, second pass (rows out) {t3 - t2:.2f} s, "
            f"NDJSON {t4 - t3:.2f} s ({encoded >> 20} MiB)")

        from fastapi.testclient import TestClient
        from sqlmodel import Session

        from service.api.main import create_app
        from service.core.db import get_engine, migrate
        from service.tenancy.tenants import bootstrap
        from tests.harness import RedisServer

        redis_server = RedisServer(base / "redis").start()
        # The api's own diff, not a writer's on Spark (which this bench runs none of).
        settings = settings.model_copy(update={"redis_url": redis_server.url, "feed_spark_rows": 10 * ROWS})
        migrate(settings.resolved_database_url())
        token = "calve_bench-feed-token-0123456789abcdef"
        with Session(get_engine(settings.resolved_database_url())) as session:
            bootstrap(session, settings.data_path, token)
        with TestClient(create_app(settings), headers={"Authorization": f"Bearer {token}"}) as http:
            t5 = time.perf_counter()
            answer = http.get("/v1/tables/accounts/changes", params={"from_snapshot": before})
            lines = answer.text.count("\n")
            t6 = time.perf_counter()
        redis_server.kill()
        assert answer.status_code == 200 and lines == changes, (answer.status_code, lines, changes)
        summary = {
            "rows": ROWS, "files": FILES, "changed": CHANGED, "change_rows": changes, "rows_read": read_rows,
            "direct_change_rows_per_s": round(changes / (t4 - t0)), "api_change_rows_per_s": round(changes / (t6 - t5)),
            "first_pass_s": round(t2 - t1, 2), "second_pass_s": round(t3 - t2, 2), "ndjson_s": round(t4 - t3, 2),
            "api_s": round(t6 - t5, 2),
        }
        say(f"through the api: {lines} lines in {t6 - t5:.2f} s")
        print(orjson.dumps(summary).decode())


if __name__ == "__main__":
    main()
