"""One writer at a time per tenant for heavy batches (service/writer/lanes.py), on a real Redis:
another writer sets the tenant's heavy batch aside and keeps serving light ones meanwhile."""

from __future__ import annotations

import time

import redis

from service.core import keys
from service.protocol.input_entry import InputEntry
from service.writer.batches import Batch
from service.writer.lanes import HEAVY_JOB_S, SLOW_JOB_S, Lanes, keep_pending


def batch(tenant: str, failures: int = 0) -> Batch:
    made = Batch(tenant, "logs")
    made.failures = failures
    return made


def test_a_tenants_heavy_batches_run_on_one_writer_at_a_time_and_light_ones_never_wait(redis_client: redis.Redis) -> None:
    first, second = Lanes(redis_client, "w1"), Lanes(redis_client, "w2")
    wide = batch("beta")
    for lanes in (first, second):
        lanes.ran(wide, HEAVY_JOB_S + 1)  # its pipeline's last job was slow on both
    with first.lane(wide) as running:
        assert running
        with second.lane(batch("beta")) as may_run:
            assert not may_run, "beta's lane is taken: set aside"
        with second.lane(batch("beta", failures=1)) as may_run:
            assert not may_run, "a batch that failed before is heavy too"
        with second.lane(batch("alpha")) as may_run:
            assert may_run, "another tenant's light batch never waits"
        with second.lane(batch("alpha", failures=1)) as may_run:
            assert may_run, "another tenant's heavy batch has a lane of its own"
    assert redis_client.get(keys.heavy_lane_key("beta")) is None, "released when the job ends"
    with second.lane(batch("beta")) as may_run:
        assert may_run


def test_a_slow_full_job_batch_takes_its_tenants_lane_only_while_other_tenants_wait_in_the_round(redis_client: redis.Redis) -> None:
    """A pipeline whose last job was the full Spark job (requests the short way cannot write) and
    took SLOW_JOB_S, below HEAVY_JOB_S: alone on the writers it runs on both at once; beside
    another tenant's batches it runs on one writer at a time, so the other serves them meanwhile
    (make chaos's poison_tenant). A short-way job as slow is light: a busy machine's own pace."""
    first, second = Lanes(redis_client, "w1"), Lanes(redis_client, "w2")
    slow = batch("demo")
    for lanes in (first, second):
        lanes.ran(slow, SLOW_JOB_S + 0.1, full=True)
    with first.lane(slow, crowded=True) as running:
        assert running
        with second.lane(batch("demo"), crowded=True) as may_run:
            assert not may_run, "beside other tenants: demo's lane is taken, set aside"
        with second.lane(batch("demo")) as may_run:
            assert may_run, "demo alone on the writers: its slow batches never wait"
        with second.lane(batch("alpha"), crowded=True) as may_run:
            assert may_run, "a tenant whose jobs are quick never waits"
    with second.lane(batch("demo"), crowded=True) as may_run:
        assert may_run, "released when the job ends"
    with first.lane(slow, crowded=True) as running:
        for lanes, seconds, full, light in ((second, SLOW_JOB_S - 0.1, True, "a quicker full job"),
                                            (second, SLOW_JOB_S + 0.1, False, "a short-way job as slow")):
            lanes.ran(slow, seconds, full=full)
            with lanes.lane(batch("demo"), crowded=True) as may_run:
                assert running and may_run, f"demo's lane is held, but its last job here was {light}: light"


def test_a_set_aside_batch_stays_with_its_writer_and_is_not_counted_as_delivered_again(redis_client: redis.Redis) -> None:
    stream = keys.input_stream_key("beta", "logs")
    redis_client.xgroup_create(stream, keys.WRITER_GROUP, id="0", mkstream=True)
    redis_client.xadd(stream, {"receipt": "r1", "body": b"{}", "events": 1})
    (_stream, [(entry_id, fields)]), = redis_client.xreadgroup(keys.WRITER_GROUP, "w1", {stream: ">"})
    aside = Batch("beta", "logs")
    aside.add(InputEntry.from_fields(entry_id, fields))
    time.sleep(0.3)
    keep_pending(redis_client, aside, "w1")
    (pending,) = redis_client.xpending_range(stream, keys.WRITER_GROUP, "-", "+", 10)
    assert pending["time_since_delivered"] < 200 and pending["consumer"] == b"w1"
    assert pending["times_delivered"] == 1, "not a delivery: MAX_DELIVERIES counts real ones only"
    # Reclaimed by another writer meanwhile (this one was too slow): never taken back.
    redis_client.xclaim(stream, keys.WRITER_GROUP, "w2", min_idle_time=0, message_ids=[entry_id])
    keep_pending(redis_client, aside, "w1")
    (pending,) = redis_client.xpending_range(stream, keys.WRITER_GROUP, "-", "+", 10)
    assert pending["consumer"] == b"w2"
