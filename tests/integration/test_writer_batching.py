"""How long a writer waits to fill a batch: the events of a pipeline that changes rows are not
held for more (they wait for their table's next run of changes, which takes every change queued
by then), those of an append pipeline are, up to CALVE_WRITER_BATCH_WAIT_S. Real Redis, a real
Writer; the pipelines are put in the writer's own cache, as it keeps them once read."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import redis

from service.core import keys
from service.core.config import Settings
from service.iceberg.catalog import open_catalog
from service.pipelines.spec import parse_definition
from service.pipelines.store import PipelineRecord
from service.protocol.input_entry import BODY, EVENTS, RECEIPT
from service.writer.loop import Writer

WAIT_S = 3.0  # the batch wait: far longer than a poll of an entry already there takes (under the socket timeout)


def definition(name: str, **sink: object) -> PipelineRecord:
    return PipelineRecord(name, 1, f"/{name}", parse_definition({
        "name": name, "source": {"http": {"path": f"/{name}"}},
        "sinks": [{"table": name, "auto_create": True, "schema": {"columns": [{"name": "id", "type": "long", "required": True}]},
                   **sink}],
    }))


def test_a_batch_of_row_changes_closes_at_once_an_append_batch_waits_to_fill(tmp_path: Path, redis_client: redis.Redis,
                                                                           redis_url: str) -> None:
    settings = Settings(data_dir=tmp_path, redis_url=redis_url, writer_batch_wait_s=WAIT_S)
    writer = Writer(settings, redis_client, open_catalog(settings), name="w")
    pipelines = {"accounts": definition("accounts", identifier_columns=["id"], mode="upsert"), "events": definition("events")}
    for name, record in pipelines.items():
        writer.batches.pipelines.get(("demo", name), lambda record=record: record)

    def poll_of(name: str) -> tuple[list, float]:
        redis_client.sadd(keys.INPUT_STREAMS, keys.member("demo", name))
        redis_client.xadd(keys.input_stream_key("demo", name), {RECEIPT: "r", EVENTS: 1, BODY: b'{"id": 1}'})
        started = time.monotonic()
        batches = writer.poll(threading.Event())
        redis_client.srem(keys.INPUT_STREAMS, keys.member("demo", name))
        return batches, time.monotonic() - started

    (changes,), took = poll_of("accounts")
    assert changes.pipeline == "accounts" and len(changes.entries) == 1
    assert took < WAIT_S / 2, f"the row changes' batch waited {took:.1f} s to fill"
    (appends,), took = poll_of("events")
    assert appends.pipeline == "events" and took >= WAIT_S, "an append pipeline's batch no longer waits to fill"
