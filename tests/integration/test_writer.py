"""Writer failover: entries a crashed writer read but never acknowledged are written by another."""

from __future__ import annotations

import time

import pytest

from service.core import keys
from tests.conftest import wait_until

pytestmark = pytest.mark.spark


@pytest.fixture(autouse=True)
def _short_way_tried_first() -> None:
    """Each test starts with no short way refusals counted in this process (pipeline_job.ShortWayRefusals)."""
    from spark_jobs import pipeline_job

    pipeline_job._refusals.clear()


def test_entries_of_a_dead_writer_are_reclaimed_and_written_once(stack_factory) -> None:  # noqa: ANN001
    stack = stack_factory(roles=("api",), CALVE_WRITER_CLAIM_IDLE_S="2")
    stream = keys.input_stream_key("demo", "logs")
    with stack.client() as http:
        receipts = [http.post("/logs", json={"id": f"orphan-{i}"}).json()["receipt"] for i in range(5)]
    # A writer that read the entries and died before its hand-off: they sit in its pending list.
    stack.redis.xgroup_create(stream, keys.WRITER_GROUP, id="0", mkstream=True)
    delivered = stack.redis.xreadgroup(keys.WRITER_GROUP, "dead-writer", {stream: ">"}, count=100)
    assert len(delivered[0][1]) == 5
    assert stack.redis.xpending(stream, keys.WRITER_GROUP)["pending"] == 5

    stack.start("writer")
    stack.start("committer")
    with stack.client() as http:
        wait_until(
            lambda: all(http.get(f"/v1/receipts/{r}").json()["status"] == "committed" for r in receipts),
            timeout_s=90, what="reclaimed entries committed",
        )
    assert sorted(row["id"] for row in stack.rows()) == [f"orphan-{i}" for i in range(5)]
    assert stack.redis.xpending(stream, keys.WRITER_GROUP)["pending"] == 0
    assert stack.redis.xlen(stream) == 0, "written entries are deleted from the input stream"


def test_a_writer_that_lost_its_entries_cannot_hand_them_off(redis_client) -> None:  # noqa: ANN001
    """Writer A's job outlives the claim idle time; B reclaims and settles first. A must not."""
    from service.writer.hand_off import HandOffPlan, HandOffScript

    stream, files = keys.input_stream_key("demo", "logs"), keys.commit_stream_key("demo", "logs")
    redis_client.xgroup_create(stream, keys.WRITER_GROUP, id="0", mkstream=True)
    ids = [redis_client.xadd(stream, {"receipt": f"r{i}", "events": "1", "body": b"{}"}).decode() for i in range(3)]
    redis_client.xreadgroup(keys.WRITER_GROUP, "writer-a", {stream: ">"})
    redis_client.xclaim(stream, keys.WRITER_GROUP, "writer-b", min_idle_time=0, message_ids=ids)
    script = HandOffScript(redis_client)

    def plan(writer: str) -> HandOffPlan:
        return HandOffPlan(xadd=[(files, ["writer", writer])], hset=[(keys.receipt_key("demo", "r0"), ["status", "written"])])

    assert script.run(redis_client, stream, keys.WRITER_GROUP, "writer-a", ids, plan("a")) == 0
    assert redis_client.xlen(files) == 0 and not redis_client.exists(keys.receipt_key("demo", "r0"))
    assert script.run(redis_client, stream, keys.WRITER_GROUP, "writer-b", ids, plan("b")) == 1
    assert [entry[1][b"writer"] for entry in redis_client.xrange(files)] == [b"b"]
    assert redis_client.xlen(stream) == 0 and redis_client.xpending(stream, keys.WRITER_GROUP)["pending"] == 0
    # A's late second try (say after a retry) finds nothing of its own left either.
    assert script.run(redis_client, stream, keys.WRITER_GROUP, "writer-a", ids, plan("a")) == 0
    assert redis_client.xlen(files) == 1


def test_backlog_counts_events_until_they_are_committed(stack_factory) -> None:  # noqa: ANN001
    stack = stack_factory(roles=("api", "writer"))
    with stack.client() as http:
        receipt = http.post("/logs", json=[{"id": 1}, {"id": 2}, {"id": 3}]).json()["receipt"]
        wait_until(lambda: http.get(f"/v1/receipts/{receipt}").json()["status"] == "written", what="written")
        # Written but not committed (no committer runs): a catalog outage looks just like this.
        assert int(stack.redis.get(keys.backlog_key("demo"))) == 3
        stack.start("committer")
        wait_until(lambda: http.get(f"/v1/receipts/{receipt}").json()["status"] == "committed", what="committed")
    assert int(stack.redis.get(keys.backlog_key("demo"))) == 0


def test_a_writer_exits_promptly_when_spark_is_already_gone(stack_factory, spark_server) -> None:  # noqa: ANN001
    """Ctrl-C on `calve up` stops Spark and the writers together. pyspark's exit hook used to
    retry releasing its session against the dead server, holding the writer for about a minute."""
    import signal
    import time

    if spark_server is None:
        pytest.skip("Spark Connect is external (CALVE_TEST_SPARK_REMOTE): this run cannot stop it")
    stack = stack_factory(roles=("api", "writer", "committer"))
    with stack.client() as http:
        assert http.post("/logs?wait=true", json={"id": "before"}).status_code == 200  # the writer has a session
    spark_server.stop()
    try:
        writer = stack.procs.pop("writer")
        started = time.monotonic()
        writer.send_signal(signal.SIGTERM)
        writer.wait(60)
        assert time.monotonic() - started < 10, f"the writer took {time.monotonic() - started:.0f} s to exit"
    finally:
        spark_server.start()


def test_batches_that_fit_their_table_take_the_short_way_and_the_others_the_spark_job(stack) -> None:  # noqa: ANN001
    """Once `logs` exists, a batch whose events fit it as they are is written by pyarrow in Spark's
    tasks (spark_jobs/direct_append.py), a field the table lacks kept in `_extra` there too; one
    with a value of another type is refused there and written by the Spark job, which converts the
    value as it always does. The metrics say which way each batch went."""
    import orjson

    def send(*events: dict) -> dict:
        with stack.client() as http:
            body = b"\n".join(orjson.dumps(event) for event in events)
            answer = http.post("/logs?wait=true&timeout=60", content=body, headers={"Content-Type": "application/x-ndjson"})
        assert answer.status_code == 200 and answer.json()["status"] == "committed", answer.text
        return answer.json()

    send({"id": 1, "msg": "creates the table", "n": 1})
    assert send({"id": 2, "msg": "fits", "n": 2}, {"id": 3, "msg": None, "n": 3})["tables"]["logs"]["rows"] == 2
    send({"id": 4, "msg": "and more", "n": 4, "level": "warn"})
    send({"id": 5, "msg": "a number as text with a sign", "n": "+5"})
    text = stack.metrics()
    assert 'calve_direct_batches_total{outcome="written",pipeline="logs",tenant="demo"} 2.0' in text
    assert 'calve_direct_batches_total{outcome="refused",pipeline="logs",tenant="demo"} 1.0' in text
    # Its tasks read the bodies from Redis themselves (spark_jobs/stream_bodies.py).
    assert 'calve_direct_bodies_total{pipeline="logs",tenant="demo",way="redis"} 3.0' in text
    rows = sorted(stack.rows(), key=lambda row: row["id"])
    assert [(row["id"], row["msg"], row["n"], row["_extra"]) for row in rows] == [
        (1, "creates the table", 1, None), (2, "fits", 2, None), (3, None, 3, None), (4, "and more", 4, [("level", "warn")]),
        (5, "a number as text with a sign", 5, None),
    ]


def test_when_sparks_tasks_cannot_reach_redis_the_bodies_are_shipped_and_nothing_is_lost(stack_factory) -> None:  # noqa: ANN001
    """Spark's tasks read the short way's bodies from Redis at CALVE_SPARK_REDIS_URL, where
    nothing listens here (as for executors outside Redis's network): the batch is written all the
    same with its bodies shipped in the job, the writer says why and what to set, and the next
    batches ship theirs without trying (off for a while)."""
    from service.cli.processes import free_port

    stack = stack_factory(CALVE_SPARK_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0")
    with stack.client() as http:
        for n in range(3):
            answer = http.post("/logs?wait=true&timeout=60", json={"id": n, "msg": f"event {n}"})
            assert answer.status_code == 200 and answer.json()["status"] == "committed", answer.text
    assert sorted(row["id"] for row in stack.rows()) == [0, 1, 2]
    text = stack.metrics()
    assert 'calve_direct_batches_total{outcome="written",pipeline="logs",tenant="demo"} 2.0' in text  # the first creates the table
    assert 'calve_direct_bodies_total{pipeline="logs",tenant="demo",way="shipped"} 2.0' in text
    assert "way=\"redis\"" not in text
    log = (stack.data_dir / "writer.log").read_text()
    assert log.count("could not read the bodies from Redis") == 1 and "CALVE_SPARK_READS_REDIS=false" in log, log


def test_a_batch_whose_entry_is_gone_from_the_stream_ships_its_bodies_and_turns_nothing_off(fresh_spark, tmp_path, redis_url) -> None:  # noqa: ANN001
    """An entry no longer in the input stream (another writer took the batch over and handed it
    off) is no sign that Spark cannot reach Redis: that batch's bodies are shipped and the next
    batch's tasks read theirs from Redis again."""
    import pyarrow as pa
    import redis

    from service.pipelines.spec import PipelineDefinition
    from spark_jobs import pipeline_job
    from spark_jobs.contract import ENTRY_BODY
    from spark_jobs.pipeline_job import PipelineJob
    from spark_jobs.stream_bodies import StreamEntries
    from spark_jobs.targets import Target

    schema = pa.schema([pa.field("msg", pa.string())])
    directories = iter(range(100))
    definition = PipelineDefinition.model_validate({"name": "events", "source": {"http": {"path": "/events"}}, "sinks": [{"table": "events"}]})
    job = PipelineJob(fresh_spark, "events", 1, definition, dlq_directory=(tmp_path / "dlq").as_uri(), known_schema=schema,
                      resolve=lambda name, sink, rows: Target(name=name, schema=schema, required=frozenset(), partition=[],
                                                              directory=(tmp_path / f"batch-{next(directories)}").as_uri()))
    client = redis.Redis.from_url(redis_url)
    kept = client.xadd("gone-test", {ENTRY_BODY: b'{"msg": "b"}'}).decode()
    gone = client.xadd("gone-test", {ENTRY_BODY: b'{"msg": "a"}'}).decode()
    client.xdel("gone-test", gone)
    pipeline_job._pointers_off_until = 0.0
    try:
        result = job.run(["r1"], [b'{"msg": "a"}'], StreamEntries(redis_url, False, "gone-test", (gone,)))
        assert (result.direct, result.bodies, result.tables["events"].rows_by_receipt) == ("written", "shipped", {"r1": 1})
        assert pipeline_job._pointers_off_until == 0.0
        result = job.run(["r2"], [b'{"msg": "b"}'], StreamEntries(redis_url, False, "gone-test", (kept,)))
        assert (result.direct, result.bodies, result.tables["events"].rows_by_receipt) == ("written", "redis", {"r2": 1})
    finally:
        pipeline_job._pointers_off_until = 0.0
        client.delete("gone-test")
        client.close()


def test_when_the_short_way_cannot_run_the_spark_job_writes_the_batch_and_it_stays_off_a_while(fresh_spark, tmp_path) -> None:  # noqa: ANN001
    """A real failure inside Spark's Python workers (the short way's storage cannot be reached: an
    S3 endpoint where nothing listens) is no failure of the batch: the short way is switched off
    for DIRECT_OFF_S and the Spark job writes the batch (here the table resolves the second time to
    a local directory, which the Spark job reaches); the next batch does not even try it."""
    import pyarrow as pa
    from pyarrow import fs as pafs

    from service.iceberg.files import list_data_files
    from service.pipelines.spec import PipelineDefinition
    from spark_jobs import pipeline_job
    from spark_jobs.pipeline_job import PipelineJob
    from spark_jobs.targets import Target

    schema = pa.schema([pa.field("msg", pa.string())])
    nowhere = pafs.S3FileSystem(endpoint_override="http://127.0.0.1:1", access_key="k", secret_key="s", region="us-east-1",
                                connect_timeout=1, request_timeout=1, retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1))
    targets = []

    def resolve(name, sink, rows):  # noqa: ANN001, ANN202
        unreachable = not targets
        directory = "s3://bucket/t/data/batch-0" if unreachable else (tmp_path / f"batch-{len(targets)}").as_uri()
        targets.append(Target(name=name, schema=schema, required=frozenset(), partition=[], directory=directory,
                              filesystem=nowhere if unreachable else None))
        return targets[-1]

    definition = PipelineDefinition.model_validate({"name": "events", "source": {"http": {"path": "/events"}}, "sinks": [{"table": "events"}]})
    job = PipelineJob(fresh_spark, "events", 1, definition, resolve=resolve,
                      dlq_directory=(tmp_path / "dlq").as_uri(), known_schema=schema)
    pipeline_job._direct_off_until = 0.0
    try:
        result = job.run(["r1"], [b'{"msg": "a"}\n{"msg": "b"}'])
        assert result.direct == "failed"
        assert result.tables["events"].rows_by_receipt == {"r1": 2} and list_data_files(targets[-1].directory), "the Spark job wrote it"
        assert pipeline_job._direct_off_until > time.monotonic() + pipeline_job.DIRECT_OFF_S - 60
        tried = len(targets)
        result = job.run(["r2"], [b'{"msg": "c"}'])
        assert result.direct is None and result.tables["events"].rows_by_receipt == {"r2": 1}
        assert len(targets) == tried + 1, "off: the short way did not even resolve its table"
    finally:
        pipeline_job._direct_off_until = 0.0
