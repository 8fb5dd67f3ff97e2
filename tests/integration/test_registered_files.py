"""Parquet files written elsewhere (by pyarrow, DuckDB and Spark), registered into a table through
POST /v1/tables/{name}/files: each file's rows in the table exactly once however often and in
whatever order it is notified, while events are ingested into the same table and the committer is
killed; and every file the table must not take refused with its reason. Collected again on S3 and
a REST catalog by test_object_store.py (there the notifications come as S3 event records)."""

from __future__ import annotations

import threading
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote_plus

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyarrow import fs as pafs

from service.core import keys
from service.iceberg.files import catalog_io, locate
from service.iceberg.rewrites import live_data_files
from tests.conftest import wait_until
from tests.harness import duckdb_rows

pytestmark = pytest.mark.spark

EVENTS = {
    "name": "events", "source": {"http": {"path": "/events"}},
    "sinks": [{"table": "events", "auto_create": True, "schema": {
        "columns": [{"name": "ts", "type": "timestamptz"}, {"name": "user", "type": "string"}, {"name": "n", "type": "long"}],
        "partition_spec": [{"column": "ts", "transform": "day"}],
    }}],
}
DAY = {20: datetime(2026, 11, 20, 3, tzinfo=timezone.utc), 21: datetime(2026, 11, 21, 9, tzinfo=timezone.utc)}


def _events_table(stack):  # noqa: ANN001, ANN202
    with stack.client() as http:
        assert http.post("/v1/pipelines", json=EVENTS).status_code == 201
        answer = http.post("/events?wait=true&timeout=60", json={"ts": "2026-11-20T01:00:00Z", "user": "http-0", "n": -1})
        assert answer.json()["status"] == "committed", answer.text
    return stack.catalog().load_table(("demo", "events"))


def _land(catalog, local: Path, uri: str) -> int:  # noqa: ANN001
    """Put a local file into the store at `uri` (the table's S3 bucket, or the local warehouse)."""
    store, path = locate(uri, catalog_io(catalog))
    if isinstance(store, pafs.LocalFileSystem):  # an object store has no directories to make
        store.create_dir(path.rsplit("/", 1)[0], recursive=True)
    with store.open_output_stream(path) as out:
        out.write(local.read_bytes())
    return local.stat().st_size


def _pyarrow_file(directory: Path, name: str, day: int, first: int, count: int) -> Path:
    path = directory / name
    pq.write_table(pa.table({
        "ts": pa.array([DAY[day]] * count, pa.timestamp("us", tz="UTC")),
        "user": [f"pyarrow-{first + i}" for i in range(count)],
        "n": pa.array(range(first, first + count), pa.int64()),
    }), path)
    return path


def _duckdb_file(directory: Path, name: str, first: int, count: int) -> Path:
    import duckdb

    path = directory / name
    duckdb.connect().execute(
        f"COPY (SELECT TIMESTAMPTZ '2026-11-21 09:00:00+00' AS ts, 'duckdb-' || i AS user, i::BIGINT AS n "
        f"FROM range({first}, {first + count}) t(i)) TO '{path}' (FORMAT parquet)"
    )
    return path


def _spark_file(spark_remote: str, directory: Path, first: int, count: int) -> Path:
    from pyspark.sql import functions as F

    from spark_jobs.session import spark_session

    spark = spark_session(spark_remote)
    out = directory / "spark"
    (spark.range(first, first + count).coalesce(1)
        .select(F.lit(DAY[20]).alias("ts"), F.concat(F.lit("spark-"), F.col("id").cast("string")).alias("user"), F.col("id").alias("n"))
        .write.option("compression", "snappy").parquet(str(out)))
    (part,) = out.glob("part-*.parquet")
    return part


def _notify(http, table_location: str, files: list[tuple[str, int]], wait: bool = False) -> dict:  # noqa: ANN001
    """Register files as a list, or (on S3) as the event notification S3 would send for them."""
    if table_location.startswith("s3://"):
        records = []
        for uri, size in files:
            bucket, _, key = uri.removeprefix("s3://").partition("/")
            records.append({"eventName": "ObjectCreated:Put", "s3": {
                "bucket": {"name": bucket}, "object": {"key": quote_plus(key, safe="/"), "size": size, "eTag": "x", "sequencer": "0A"},
            }})
        body = {"Records": records}
    else:
        body = {"files": [{"path": uri, "size": size} for uri, size in files]}
    answer = http.post(f"/v1/tables/events/files?wait={str(wait).lower()}&timeout=60", json=body)
    assert answer.status_code in (200, 202), answer.text
    return answer.json()


def test_files_from_three_writers_are_registered_once_each_under_ingest_and_a_committer_kill(
    stack_factory, spark_remote: str, tmp_path: Path,  # noqa: ANN001
) -> None:
    stack = stack_factory()
    table = _events_table(stack)
    catalog = stack.catalog()
    landing = f"{table.location()}/data/landing"
    local = tmp_path / "written"
    local.mkdir()
    written = {
        "a.parquet": _pyarrow_file(local, "a.parquet", 20, 0, 300),
        "b with space.parquet": _pyarrow_file(local, "b.parquet", 21, 300, 200),
        "c.parquet": _duckdb_file(local, "c.parquet", 0, 250),
        "d.parquet": _spark_file(spark_remote, local, 0, 400),
    }
    files = {name: (f"{landing}/{name}", _land(catalog, path, f"{landing}/{name}")) for name, path in written.items()}
    expected = sorted(row["user"] for path in written.values() for row in pq.read_table(path).to_pylist())

    # Events keep arriving at the same table meanwhile.
    stop = threading.Event()
    sent: list[str] = []

    def ingest() -> None:
        with stack.client() as http:
            while not stop.is_set():
                user = f"http-{len(sent) + 1}"
                if http.post("/events?wait=true&timeout=60", json={"ts": "2026-11-21T00:00:00Z", "user": user, "n": 0}).status_code == 200:
                    sent.append(user)

    producer = threading.Thread(target=ingest)
    producer.start()
    try:
        with stack.client() as http:
            first = _notify(http, table.location(), [files["a.parquet"], files["b with space.parquet"]], wait=True)
            assert (first["status"], first["accepted"], first["rows"]) == ("committed", 2, 500), first
            # Again, and the later files out of order, then all of them once more, with the
            # committer killed while some are registered and not yet committed.
            again = _notify(http, table.location(), [files["b with space.parquet"], files["a.parquet"]])
            assert again["duplicate"] == 2 and {f["receipt"] for f in again["files"]} == {first["receipt"]}, again
            stack.kill("committer")
            late = _notify(http, table.location(), [files["d.parquet"]])
            assert late["accepted"] == 1, late
            other = _notify(http, table.location(), [files["d.parquet"], files["c.parquet"]])
            assert other["accepted"] == 1, other
            stack.start("committer")
            everything = _notify(http, table.location(), list(files.values()), wait=True)
            assert everything["duplicate"] == 4 and everything["accepted"] == 0, everything
            for receipt in (late["receipt"], other["receipt"]):
                wait_until(lambda r=receipt: http.get(f"/v1/receipts/{r}").json()["status"] == "committed", 90, what="the late files committed")
            recent = http.get("/v1/tables/events/files").json()["registrations"]
            assert sorted(r["path"] for r in recent) == sorted(uri for uri, _size in files.values())
    finally:
        stop.set()
        producer.join(120)

    table = catalog.load_table(("demo", "events"))
    rows = table.scan().to_arrow().to_pylist()
    registered = sorted(row["user"] for row in rows if not row["user"].startswith("http-"))
    assert registered == expected, "every registered file's rows, once"
    assert sorted(row["user"] for row in rows if row["user"].startswith("http-")) == sorted(["http-0", *sent]), "ingest lost nothing"
    assert len(sent) > 0
    live = live_data_files(table)
    assert all(uri in live for uri, _size in files.values())
    assert {file.partition[0] for path, file in live.items() if path.startswith(landing)} == {
        (DAY[20].date() - datetime(1970, 1, 1).date()).days, (DAY[21].date() - datetime(1970, 1, 1).date()).days,
    }
    counted = sum(int(s.summary.additional_properties.get(keys.SUMMARY_REGISTERED, 0)) for s in table.metadata.snapshots)
    assert counted == len(files), "the snapshots that added registered files say so"
    if table.location().startswith("file:"):
        assert sorted(row["user"] for row in duckdb_rows(table) if not row["user"].startswith("http-")) == expected, "DuckDB reads them too"


def test_a_file_notified_after_its_key_expired_is_not_added_twice(stack_factory, tmp_path: Path) -> None:  # noqa: ANN001
    """The deduplication keys go after registration_dedup_ttl_s; the table itself still holds the
    file, and the leader skips it."""
    stack = stack_factory()
    table = _events_table(stack)
    uri = f"{table.location()}/data/landing/once.parquet"
    size = _land(stack.catalog(), _pyarrow_file(tmp_path, "once.parquet", 20, 0, 10), uri)
    with stack.client() as http:
        assert _notify(http, table.location(), [(uri, size)], wait=True)["status"] == "committed"
        for key in stack.redis.scan_iter(match=keys.registered_file_key("demo", "events", "*")):
            stack.redis.delete(key)  # as the time to live would
        again = _notify(http, table.location(), [(uri, size)], wait=True)
        assert again["accepted"] == 1 and again["status"] == "committed", again
    table = stack.catalog().load_table(("demo", "events"))
    assert sum(1 for row in table.scan().to_arrow().to_pylist() if row["user"].startswith("pyarrow-")) == 10
    assert table.current_snapshot().summary.additional_properties[keys.SUMMARY_REGISTERED] == "0"


def test_files_the_table_must_not_take_are_refused_with_their_reason(stack_factory, tmp_path: Path) -> None:  # noqa: ANN001
    stack = stack_factory(CALVE_LANDING_PREFIXES=orjson.dumps({"demo": [(tmp_path / "landing" / "demo").as_uri()]}).decode())
    table = _events_table(stack)
    catalog = stack.catalog()
    data = f"{table.location()}/data/landing"
    local = tmp_path / "local"
    local.mkdir()

    def land(name: str, path: Path, where: str = data) -> tuple[str, int]:
        uri = f"{where}/{name}"
        return uri, _land(catalog, path, uri)

    csv = local / "fake.parquet"
    csv.write_text("ts,user,n\n2026-11-20T00:00:00Z,x,1\n")
    conflicting = local / "types.parquet"
    pq.write_table(pa.table({"ts": pa.array([DAY[20]], pa.timestamp("us", tz="UTC")), "user": ["x"], "n": ["not a long"]}), conflicting)
    two_days = local / "two.parquet"
    pq.write_table(pa.table({"ts": pa.array([DAY[20], DAY[21]], pa.timestamp("us", tz="UTC")), "user": ["x", "y"], "n": [1, 2]}), two_days)
    extra = local / "extra.parquet"
    pq.write_table(pa.table({"ts": pa.array([DAY[20]], pa.timestamp("us", tz="UTC")), "user": ["x"], "n": [1], "secret": ["s"]}), extra)
    nanos = local / "nanos.parquet"
    pq.write_table(pa.table({"ts": pa.array([DAY[20]], pa.timestamp("ns", tz="UTC")), "user": ["x"], "n": [1]}), nanos)
    good = _pyarrow_file(local, "good.parquet", 20, 0, 5)
    own = next(path for path in live_data_files(table) if "/data/batch-" in path)

    granted = (tmp_path / "landing" / "demo" / "ok.parquet")
    granted.parent.mkdir(parents=True)
    granted.write_bytes(good.read_bytes())
    foreign = tmp_path / "landing" / "other" / "x.parquet"
    foreign.parent.mkdir(parents=True)
    foreign.write_bytes(good.read_bytes())

    checks = {
        "location": [
            (table.location().rsplit("/", 2)[0] + "/other/events/data/landing/x.parquet", None),
            (f"{data}/../../../other/events/data/x.parquet", None),
            (f"{data}/%2e%2e/x.parquet", None),
            (foreign.as_uri(), None),
            (own, None),
        ],
        "not_parquet": [land("fake.parquet", csv)],
        "types": [land("types.parquet", conflicting), land("nanos.parquet", nanos)],
        "partition": [land("two.parquet", two_days)],
        "columns": [land("extra.parquet", extra)],
        "not_found": [(f"{data}/missing.parquet", None)],
        "size": [(land("good.parquet", good)[0], 1)],
    }
    with stack.client() as http:
        for reason, files in checks.items():
            answer = http.post("/v1/tables/events/files", json={"files": [{"path": p, "size": s} for p, s in files]})
            assert answer.status_code == 422, (reason, answer.text)
            body = answer.json()
            assert [f["reason"] for f in body["files"]] == [reason] * len(files), body
            assert all(f["status"] == "refused" and f["detail"] for f in body["files"])
            if reason in ("types", "columns"):
                assert [c["name"] for c in body["table_columns"]] == ["ts", "user", "n"]
        # What the tenant may register: its landing prefix, and a good file in its table's data location.
        answer = http.post("/v1/tables/events/files?wait=true&timeout=60", json={"files": [{"path": str(granted)}, {"path": land("good.parquet", good)[0]}]})
        assert answer.status_code == 200 and answer.json()["accepted"] == 2, answer.text
        assert http.post("/v1/tables/_calve_dlq/files", json={"files": [{"path": str(granted)}]}).status_code == 422
        too_many = http.post("/v1/tables/events/files", json={"files": [{"path": f"{data}/{i}.parquet"} for i in range(1001)]})
        assert too_many.status_code == 413
        deletes = {"Records": [{"eventName": "ObjectRemoved:Delete", "s3": {"bucket": {"name": "b"}, "object": {"key": "k.parquet"}}}]}
        ignored = http.post("/v1/tables/events/files", json=deletes)
        assert ignored.status_code == 200 and ignored.json()["ignored"] == 1
        token = http.post("/v1/tokens", json={"scopes": ["ingest"]}).json()["token"]
    with stack.client(token=token) as http:
        assert http.post("/v1/tables/events/files", json={"files": [{"path": str(granted)}]}).status_code == 403
    text = stack.metrics()
    assert 'calve_registered_files_total{outcome="refused",reason="partition",table="events",tenant="demo"} 1.0' in text
    assert 'calve_registered_files_total{outcome="accepted",reason="",table="events",tenant="demo"} 2.0' in text
    rows = catalog.load_table(("demo", "events")).scan().to_arrow().to_pylist()
    assert sorted(row["user"] for row in rows if row["user"].startswith("pyarrow-")) == sorted([f"pyarrow-{i}" for i in range(5)] * 2)


def test_a_file_removed_after_it_was_registered_fails_its_receipt_and_nothing_else(stack_factory, tmp_path: Path) -> None:  # noqa: ANN001
    """The leader commits the api's description of a file, asking the store only its size: a file
    gone by then is not committed (readers would fail on it); its receipt fails with the reason,
    and the files registered after it are committed."""
    stack = stack_factory()
    table = _events_table(stack)
    catalog = stack.catalog()
    gone, kept = (f"{table.location()}/data/landing/{name}.parquet" for name in ("gone", "kept"))
    sizes = {uri: _land(catalog, _pyarrow_file(tmp_path, f"{i}.parquet", 20, 100 * i, 10), uri) for i, uri in enumerate((gone, kept))}
    stack.kill("committer")
    with stack.client() as http:
        first = _notify(http, table.location(), [(gone, sizes[gone])])
        second = _notify(http, table.location(), [(kept, sizes[kept])])
        store, path = locate(gone, catalog_io(catalog))
        store.delete_file(path)
        stack.start("committer")
        wait_until(lambda: http.get(f"/v1/receipts/{first['receipt']}").json()["status"] == "failed", 90, what="the gone file's receipt failed")
        assert "removed after it was registered" in http.get(f"/v1/receipts/{first['receipt']}").json()["error"]
        wait_until(lambda: http.get(f"/v1/receipts/{second['receipt']}").json()["status"] == "committed", 90, what="the next file committed")
    live = live_data_files(catalog.load_table(("demo", "events")))
    assert kept in live and gone not in live
