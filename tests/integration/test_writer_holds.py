"""A live writer keeps what it holds: no other writer reclaims the entries of a batch whose job is
running, however long the job takes (service/writer/lanes.py kept_pending).

A reclaim is not harmless even when the hand-off later sorts out who owns what: Redis counts it
as a delivery, and a request delivered MAX_DELIVERIES times goes to the DLQ. Real Redis, real
writers; the long job is a stand-in (`batches.write` sleeping), for a Spark job the Connect client
keeps retrying while the server is stopped, which the fault suite's spark_stopped produces only
now and then."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import redis

from service.core import keys
from service.core.config import Settings
from service.iceberg.catalog import open_catalog
from service.protocol.input_entry import BODY, EVENTS, RECEIPT
from service.writer.batches import Batch, pending_of
from service.writer.loop import Writer
from service.writer.outcome import BatchOutcome

CLAIM_IDLE_S = 2.0  # the keeper refreshes every third of it: 1.3 s to spare on a loaded machine


def test_a_retried_batch_whose_job_runs_long_is_not_reclaimed_by_the_other_writer(tmp_path: Path, redis_client: redis.Redis,
                                                                                 redis_url: str) -> None:
    settings = Settings(data_dir=tmp_path, redis_url=redis_url, writer_claim_idle_s=CLAIM_IDLE_S)
    tenant, pipeline = "demo", keys.DEFAULT_PIPELINE  # redis_client flushed Redis: the only stream
    stream = keys.input_stream_key(tenant, pipeline)
    redis_client.sadd(keys.INPUT_STREAMS, keys.member(tenant, pipeline))
    redis_client.xadd(stream, {RECEIPT: "r1", EVENTS: 1, BODY: b'{"id": 1}'})
    catalog = open_catalog(settings)
    busy, other = Writer(settings, redis_client, catalog, name="busy"), Writer(settings, redis_client, catalog, name="other")
    (batch,) = busy.poll(threading.Event())
    batch.failures = 1  # failed once before: written from the retries, popped off them for its job
    busy._retries.append(batch)
    taken: list[Batch] = []

    def long_job(_written: Batch) -> BatchOutcome:
        deadline = time.monotonic() + 3 * CLAIM_IDLE_S
        while time.monotonic() < deadline:
            taken.extend(other.reclaim_stale())
            time.sleep(CLAIM_IDLE_S / 4)
        return BatchOutcome()  # (as BatchWriter.write answers: nothing written here)

    busy.batches.write = long_job
    busy.write_round([], threading.Event())
    assert not taken, "the other writer took over entries whose job was still running"
    (row,) = pending_of(redis_client, stream, batch.entries, "busy").values()
    assert row["times_delivered"] == 1, "a delivery counted against the request while its job ran"
