"""Compaction on Spark, against real Redis, Spark Connect and Iceberg tables read back."""

from __future__ import annotations

import datetime
import signal
import time
import uuid
from pathlib import Path

import orjson
import pytest

from service.core import keys
from service.iceberg.rewrites import live_data_files
from service.protocol.compaction import CompactionRequest
from tests.conftest import (
    Stack,
    all_committed,
    assert_exactly_once,
    post_batches,
    wait_until,
)
from tests.harness import duckdb_rows

pytestmark = pytest.mark.spark


def snapshot_operations(stack: Stack) -> list[str]:
    table = stack.catalog().load_table(("demo", "logs"))
    return [snapshot.summary.operation.value for snapshot in table.snapshots()]


def upkeep_record(stack: Stack, task: str = "compact") -> dict:
    with stack.client() as http:
        return http.get("/v1/tables/logs").json()["health"]["upkeep"].get(task, {})


def test_small_files_are_compacted_while_ingest_keeps_committing(stack_factory) -> None:  # noqa: ANN001
    """The leader asks for a compaction once a partition holds enough small files; a writer
    rewrites them on Spark; the leader commits a `replace` snapshot. Requests posted meanwhile
    commit around it, and every row is read back exactly once, before and after."""
    stack = stack_factory(CALVE_UPKEEP_INTERVAL_S="1", CALVE_COMPACT_MIN_FILES="6")
    receipts = []
    for round_ in range(6):
        receipts += post_batches(stack, batches=1, per_batch=50, prefix=f"c{round_}")
        wait_until(lambda: all_committed(stack, receipts), timeout_s=60, what="committed")
    before = sorted(row["id"] for row in stack.rows())

    # Ingest goes on while the compaction is asked for, run and committed.
    during = []
    deadline = time.monotonic() + 90
    while upkeep_record(stack).get("outcome") != "ok" and time.monotonic() < deadline:
        during += post_batches(stack, batches=1, per_batch=10, prefix=f"d{len(during)}")
        time.sleep(0.3)
    record = upkeep_record(stack)
    assert record.get("outcome") == "ok", record
    wait_until(lambda: all_committed(stack, during), timeout_s=60, what="the requests posted meanwhile committed")

    assert "replace" in snapshot_operations(stack)
    assert record["files_rewritten"] >= 6 and record["files_written"] == 1 and record["rows"] >= 300
    table = stack.catalog().load_table(("demo", "logs"))
    assert len(live_data_files(table)) <= len(during) + 1, "six small files became one"
    after = sorted(row["id"] for row in stack.rows())
    assert sorted(row["id"] for row in duckdb_rows(table)) == after, "DuckDB reads the compacted table as pyiceberg does"
    assert sorted(set(after) - {f"d{n}-0-{i}" for n in range(len(during)) for i in range(10)}) == before
    assert_exactly_once(stack, expected=300 + 10 * len(during))
    assert "unexpected error" not in (stack.data_dir / "writer.log").read_text(), "the compaction's hand-off ends cleanly"


def test_a_rewrite_of_files_another_rewrite_replaced_first_is_dropped(stack_factory) -> None:  # noqa: ANN001
    """Two compactions of the same files race (a duplicate request, as after a lost writer): the
    first commits, the second finds its files replaced and is dropped with its own files deleted,
    never committed over the first, and neither is left on the commit stream of the table, idle
    since (both handed off before the leader plans them: an approximate trim of the first kept it
    in the stream node the dropped second shared, a waiting entry until the table's next commit)."""
    stack = stack_factory(CALVE_UPKEEP_INTERVAL_S="3600")
    receipts = post_batches(stack, batches=4, per_batch=25, prefix="r")
    for round_ in range(3):
        receipts += post_batches(stack, batches=1, per_batch=25, prefix=f"r{round_}")
        wait_until(lambda: all_committed(stack, receipts), timeout_s=60, what="committed")
    table = stack.catalog().load_table(("demo", "logs"))
    files = sorted(live_data_files(table))
    assert len(files) >= 4
    more = post_batches(stack, batches=3, per_batch=10, prefix="m")
    wait_until(lambda: all_committed(stack, more), timeout_s=60, what="the appends committed")
    stack.kill("committer", signal.SIGTERM)  # lets its leases go
    requests = [CompactionRequest("demo", "logs", uuid.uuid4().hex, [(files, 1)]) for _ in range(2)]
    stack.redis.set(keys.compacting_key("demo", "logs"), requests[0].request)
    for request in requests:
        stack.redis.rpush(keys.COMPACTIONS, request.to_json())
    stream = keys.commit_stream_key("demo", "logs")
    before = stack.redis.xlen(stream)
    wait_until(lambda: stack.redis.xlen(stream) == before + 2, timeout_s=90, what="both rewrites handed off")
    stack.start("committer")

    wait_until(lambda: stack.redis.llen(keys.COMPACTIONS) == 0 and stack.redis.xlen(stream) == 0,
               timeout_s=90, what="both rewrites settled")
    wait_until(lambda: upkeep_record(stack).get("request") == requests[1].request, timeout_s=90, what="the second rewrite settled")
    assert snapshot_operations(stack).count("replace") == 1
    record = upkeep_record(stack)
    assert record["outcome"] == "dropped" and record["request"] == requests[1].request, record
    assert "no longer in the table" in record["error"]
    assert not stack.redis.exists(keys.compacting_key("demo", "logs")), "a settled compaction releases its table"
    live = live_data_files(stack.catalog().load_table(("demo", "logs")))
    assert not set(files) & set(live)
    data = [path for path in (stack.data_dir / "warehouse").rglob("*.parquet") if "compact-" in str(path)]
    assert len(data) == 1, f"the dropped rewrite's files are deleted: {data}"
    assert_exactly_once(stack, expected=175 + 30)


def test_a_writer_goes_on_writing_batches_while_its_compaction_runs(stack_factory) -> None:  # noqa: ANN001
    """One writer, given a compaction of twelve Spark jobs (a file each): requests posted while
    it runs are written and committed before its rewrite is. Run between the writer's batches,
    as compactions were, it held every one of them until it ended."""
    stack = stack_factory(CALVE_UPKEEP_INTERVAL_S="3600")
    receipts = []
    for round_ in range(12):
        receipts += post_batches(stack, batches=1, per_batch=5, prefix=f"s{round_}")
        wait_until(lambda: all_committed(stack, receipts), timeout_s=60, what="committed")
    files = sorted(live_data_files(stack.catalog().load_table(("demo", "logs"))))
    assert len(files) == 12
    before = len(snapshot_operations(stack))
    request = CompactionRequest("demo", "logs", uuid.uuid4().hex, [([path], 1) for path in files])
    stack.redis.set(keys.compacting_key("demo", "logs"), request.request)
    stack.redis.rpush(keys.COMPACTIONS, request.to_json())
    wait_until(lambda: stack.redis.llen(keys.COMPACTIONS) == 0, timeout_s=30, interval_s=0.02, what="the writer took the compaction")

    during = 0
    with stack.client() as http:
        while "replace" not in snapshot_operations(stack)[before:] and during < 60:
            body = b"\n".join(orjson.dumps({"id": f"d{during}-{i}"}) for i in range(5))
            answer = http.post("/logs?wait=true&timeout=60", content=body, headers={"Content-Type": "application/x-ndjson"})
            assert answer.status_code == 200, answer.text
            during += 1
    wait_until(lambda: upkeep_record(stack).get("request") == request.request, timeout_s=90, what="the compaction settled")
    assert upkeep_record(stack)["outcome"] == "ok", upkeep_record(stack)
    operations = snapshot_operations(stack)[before:]
    assert operations.count("replace") == 1
    assert operations.index("replace") > 0, f"no request posted during the compaction was committed before it: {operations}"
    assert not set(files) & set(live_data_files(stack.catalog().load_table(("demo", "logs"))))
    assert_exactly_once(stack, expected=60 + 5 * during)


def test_upkeep_by_hand_answers_what_each_task_did(stack_factory) -> None:  # noqa: ANN001
    stack = stack_factory(CALVE_UPKEEP_INTERVAL_S="3600")
    receipts = []
    for round_ in range(3):
        receipts += post_batches(stack, batches=1, per_batch=20, prefix=f"h{round_}")
        wait_until(lambda: all_committed(stack, receipts), timeout_s=60, what="committed")
    with stack.client() as http:
        assert http.post("/v1/tables/nope/maintenance", json={"tasks": ["expire"]}).status_code == 404
        refused = http.post("/v1/tables/logs/maintenance", json={"tasks": ["vacuum"]})
        assert refused.status_code == 422 and refused.json()["errors"][0]["field"].startswith("body.tasks")
        answer = http.post("/v1/tables/logs/maintenance", json={"tasks": ["compact", "manifests", "expire", "orphans"], "wait_s": 120})
        assert answer.status_code == 200, answer.text
        tasks = answer.json()["tasks"]
        assert answer.json()["pending"] == []
        assert tasks["manifests"]["manifests_merged"] == 3, tasks
        assert tasks["compact"]["outcome"] == "ok" and tasks["compact"]["files_rewritten"] == 3, tasks
        assert tasks["expire"]["outcome"] == "ok" and tasks["orphans"]["outcome"] == "ok"
        health = http.get("/v1/tables/logs").json()["health"]
        # The replace's manifests merged into one: the merged file added, the three small ones marked deleted.
        assert health["data_files"] == 1 and health["manifests"] == 1, health
        # Nothing left to do: answered at once, and said so.
        again = http.post("/v1/tables/logs/maintenance", json={"tasks": ["compact"]}).json()["tasks"]["compact"]
        assert again["requested_files"] == 0, again
    assert snapshot_operations(stack)[-2:] == ["replace", "replace"]
    assert_exactly_once(stack, expected=60)


def test_partitioned_tables_compact_per_partition_and_keep_their_settings(stack_factory) -> None:  # noqa: ANN001
    """Day and bucket partitions: each partition's small files merge into files of that partition
    alone (pyiceberg prunes to them by the partition), and the sink's upkeep settings are the
    table's properties."""
    from pyiceberg.expressions import EqualTo

    stack = stack_factory(CALVE_UPKEEP_INTERVAL_S="3600")
    with stack.client() as http:
        created = http.post("/v1/pipelines", json={
            "name": "parts", "source": {"http": {"path": "/parts"}},
            "sinks": [{"table": "parts", "auto_create": True, "target_file_size": 4 * 1024 * 1024,
                       "snapshot_max_age": 7200, "snapshot_max_count": 300, "schema": {
                           "columns": [{"name": "ts", "type": "timestamptz", "required": True},
                                       {"name": "user", "type": "string"}, {"name": "n", "type": "long"}],
                           "partition_spec": [{"column": "ts", "transform": "day"}, {"column": "user", "transform": "bucket[2]"}],
                       }}],
        })
        assert created.status_code == 201, created.text
        for round_ in range(3):
            body = b"\n".join(
                orjson.dumps({"ts": f"2026-11-{20 + i % 2}T0{round_}:00:00Z", "user": f"u{i % 5}", "n": round_ * 100 + i})
                for i in range(100)
            )
            answer = http.post("/parts?wait=true&timeout=60", content=body, headers={"Content-Type": "application/x-ndjson"})
            assert answer.status_code == 200, answer.text
        table = stack.catalog().load_table(("demo", "parts"))
        assert table.properties["write.target-file-size-bytes"] == str(4 * 1024 * 1024)
        assert table.properties["history.expire.max-snapshot-age-ms"] == "7200000"
        assert table.properties["calve.expire.max-snapshots"] == "300"
        before = live_data_files(table)
        partitions = {file.partition for file in before.values()}
        assert len(before) == 3 * len(partitions)
        answer = http.post("/v1/tables/parts/maintenance", json={"tasks": ["compact"], "wait_s": 120})
        assert answer.status_code == 200 and answer.json()["tasks"]["compact"]["outcome"] == "ok", answer.text
    table = stack.catalog().load_table(("demo", "parts"))
    after = live_data_files(table)
    assert len(after) == len(partitions) and {file.partition for file in after.values()} == partitions, "one file per partition"
    assert sorted(table.scan().to_arrow().column("n").to_pylist()) == list(range(300))
    day = (datetime.date(2026, 11, 20) - datetime.date(1970, 1, 1)).days
    pruned = {task.file.partition for task in table.scan(row_filter=EqualTo("ts", "2026-11-20T00:00:00+00:00")).plan_files()}
    assert pruned and all(partition[0] == day for partition in pruned) and len(pruned) < len(partitions)


class CountedJobs:
    """A real Spark session that counts the runs of each job copy_files makes (one task a run)."""

    def __init__(self, spark) -> None:  # noqa: ANN001
        self.spark, self.jobs = spark, []

    def createDataFrame(self, data, schema):  # noqa: ANN001, ANN201 - the session's own name
        self.jobs.append(len(data))
        return self.spark.createDataFrame(data, schema)


def six_small_files(tmp_path: Path) -> tuple:
    """Six Parquet files of ten rows each (ids 0 to 59 in order), in an Arrow schema with `id` required: (schema, paths)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "msg", StringType())).as_arrow()
    paths = []
    for index in range(6):
        path = tmp_path / f"small-{index}.parquet"
        pq.write_table(pa.table({"id": pa.array(range(index * 10, index * 10 + 10), pa.int64()), "msg": [f"m{index}"] * 10}, schema=schema), path)
        paths.append(str(path))
    return schema, paths


@pytest.mark.parametrize(("tasks", "jobs"), [(1, [1, 1, 1]), (2, [2, 1]), (None, [3])])
def test_a_compactions_copies_run_at_most_compact_tasks_at_once_and_copy_every_row(fresh_spark, tmp_path, tasks, jobs) -> None:  # noqa: ANN001
    """Spark gives a job's tasks every free core before a later job's: a compaction's copies run as
    jobs of at most compact_tasks tasks, one after another, so the writers' jobs find a core."""
    import pyarrow.parquet as pq
    from pyarrow import fs as pafs

    from service.iceberg.files import list_data_files
    from spark_jobs.compact_job import copy_files

    schema, paths = six_small_files(tmp_path)
    spark = CountedJobs(fresh_spark)
    written = copy_files(spark, paths, schema, str(tmp_path / "out"), pafs.LocalFileSystem(), 3, tasks=tasks)
    assert spark.jobs == jobs
    copies = list_data_files((tmp_path / "out").as_uri())
    assert written == 60 and len(copies) == 3
    assert sorted(row["id"] for path in copies for row in pq.read_table(path).to_pylist()) == list(range(60))


def test_a_compactions_tasks_copy_the_row_groups_of_files_written_alike_with_each_sources_place(fresh_spark, tmp_path) -> None:  # noqa: ANN001
    """Files written alike, each holding a writer task's rows, are copied by compaction's Spark
    tasks row group by row group (each output holds its run's row groups, as many as they had,
    and the rows in order), with the layout that says where each source's rows now are (what a
    delete committed meanwhile is carried over by); in a run that also holds a quiet producer's
    small file, that file's rows are encoded into a row group of their own, in their place."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyarrow import fs as pafs
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    from service.iceberg.files import list_data_files
    from spark_jobs.compact_job import COPIED_ROW_GROUP_ROWS, copy_files
    from spark_jobs.contract import layout_path

    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "msg", StringType())).as_arrow()
    sizes = [COPIED_ROW_GROUP_ROWS, COPIED_ROW_GROUP_ROWS + 5, 10, COPIED_ROW_GROUP_ROWS]  # the third: a quiet producer's file
    paths, first = [], 0
    for index, size in enumerate(sizes):
        path = tmp_path / f"part-{index}.parquet"
        pq.write_table(pa.table({"id": pa.array(range(first, first + size), pa.int64()), "msg": [f"m{index}"] * size}, schema=schema), path,
                       compression="zstd")  # as writers write them
        paths.append(str(path))
        first += size
    written = copy_files(fresh_spark, paths, schema, str(tmp_path / "out"), pafs.LocalFileSystem(), 2)
    assert written == sum(sizes)
    by_first: dict[int, tuple[list[int], list]] = {}  # per output, by its first id: its row groups' rows, its layout
    for copy in list_data_files((tmp_path / "out").as_uri()):
        local = copy.removeprefix("file://")
        ids = pq.read_table(local).column("id").to_pylist()
        assert ids == sorted(ids)
        metadata = pq.read_metadata(local)
        by_first[ids[0]] = ([metadata.row_group(index).num_rows for index in range(metadata.num_row_groups)],
                            json.loads(Path(layout_path(local)).read_text()))
    assert by_first == {
        0: (sizes[:2], [[paths[0], 0, sizes[0], []], [paths[1], sizes[0], sizes[1], []]]),
        sizes[0] + sizes[1]: (sizes[2:], [[paths[2], 0, sizes[2], []], [paths[3], sizes[2], sizes[3], []]]),
    }


@pytest.mark.parametrize(("tasks", "waves"), [(1, ["wave-0", "wave-1", "wave-2"]), (2, ["wave-0", "wave-1"]), (None, [""])])
def test_a_compaction_spark_rewrites_runs_at_most_compact_tasks_at_once_and_keeps_every_row(fresh_spark, tmp_path, tasks, waves) -> None:  # noqa: ANN001
    """When pyarrow cannot copy the files, Spark's reader and writer rewrite them: as jobs of at
    most compact_tasks output files, one after another (each into a directory of its own), not one
    job of every output's tasks at once."""
    import pyarrow.parquet as pq

    from service.iceberg.files import list_data_files
    from spark_jobs.compact_job import spark_rewrite

    schema, paths = six_small_files(tmp_path)
    spark_rewrite(fresh_spark, paths, schema, frozenset({"id"}), str(tmp_path / "out"), 3, tasks=tasks)
    out = (tmp_path / "out").as_uri()
    copies = list_data_files(out)
    by_wave: dict[str, int] = {}
    for path in copies:
        wave = path[len(out) + 1:].rpartition("/")[0]
        by_wave[wave] = by_wave.get(wave, 0) + 1
    assert sorted(by_wave) == waves and max(by_wave.values()) <= (tasks or 3)
    assert sorted(row["id"] for path in copies for row in pq.read_table(path.removeprefix("file://")).to_pylist()) == list(range(60))


@pytest.mark.parametrize("tasks", [None, 1])
def test_a_leaders_other_spark_jobs_read_and_shuffle_in_at_most_compact_tasks_tasks(fresh_spark, tmp_path, tasks) -> None:  # noqa: ANN001
    """A run of changes too large for one task and a feed's diff share Spark's cores with every
    writer's ingest, as a compaction does: under tasks_at_most (a writer's compact_tasks) the
    files a job reads are split into at most that many tasks, and its shuffles into that many
    partitions; the session's own settings are back after."""
    from service.iceberg.files import list_data_files
    from spark_jobs.session import tasks_at_most

    _schema, paths = six_small_files(tmp_path)
    names = ("spark.sql.shuffle.partitions", "spark.sql.files.maxPartitionNum")
    before = [fresh_spark.conf.get(name, None) for name in names]
    with tasks_at_most(fresh_spark, tasks):
        fresh_spark.read.parquet(*paths).write.parquet(str(tmp_path / "out"))  # no shuffle: a file per reading task
        shuffles = fresh_spark.conf.get(names[0])
    read_by = len(list_data_files((tmp_path / "out").as_uri()))
    if tasks is None:
        assert read_by > 1 and shuffles == before[0]  # the control: six files are more than one task's reading
    else:
        assert read_by == tasks and shuffles == str(tasks)
    assert [fresh_spark.conf.get(name, None) for name in names] == before
