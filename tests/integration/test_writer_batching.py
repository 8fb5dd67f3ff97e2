"""How long a writer waits to fill a batch: the events of a pipeline that changes rows are not
held for more (they wait for their table's next run of changes, which takes every change queued
by then), those of an append pipeline are, up to CALVE_WRITER_BATCH_WAIT_S, and a busy stream's
on, up to CALVE_WRITER_BATCH_MAX_WAIT_S, until its batch holds CALVE_WRITER_BATCH_FILL_EVENTS.
Real Redis, a real Writer; the pipelines are put in the writer's own cache, as it keeps them once
read."""

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


def test_a_busy_streams_batch_waits_on_until_it_fills_a_quiet_ones_closes_at_the_wait(tmp_path: Path, redis_client: redis.Redis,
                                                                                   redis_url: str) -> None:
    wait_s, max_wait_s = 1.0, 3.0
    settings = Settings(data_dir=tmp_path, redis_url=redis_url, writer_batch_wait_s=wait_s, writer_batch_max_wait_s=max_wait_s,
                        writer_batch_fill_events=40)
    writer = Writer(settings, redis_client, open_catalog(settings), name="w")
    writer.batches.pipelines.get(("demo", "events"), lambda: definition("events"))
    redis_client.sadd(keys.INPUT_STREAMS, keys.member("demo", "events"))
    stream = keys.input_stream_key("demo", "events")

    def send(events: int, to: str = stream) -> None:
        redis_client.xadd(to, {RECEIPT: "r", EVENTS: events, BODY: b'{"id": 1}\n' * events})

    def poll(*later: tuple) -> tuple[int, float]:
        """The events of the writer's next batch and how long it took to close, while `later`'s
        requests (seconds after the poll began, events, and a stream if not the busy one) come in."""
        senders = [threading.Timer(at, send, request) for at, *request in later]
        for sender in senders:
            sender.start()
        started = time.monotonic()
        batches = writer.poll(threading.Event())
        took = time.monotonic() - started
        for sender in senders:
            sender.join()
        return sum(batch.events for batch in batches), took

    send(3)  # quiet: under an eighth of the fill by the wait's end
    events, took = poll()
    assert events == 3 and wait_s <= took < max_wait_s - 0.5, f"a quiet stream's batch closed after {took:.1f} s"
    send(20)  # busy, and no more comes: it waits the longest wait out
    events, took = poll()
    assert events == 20 and took >= max_wait_s, f"a busy stream's batch closed after {took:.1f} s, unfilled"
    send(20)  # busy, and filled 1.5 s in: closed then, not at the longest wait
    events, took = poll((1.5, 25))
    # (The sender's timer starts a moment before the poll's clock: 1.5 s on it may read 1.499.)
    assert events == 45 and 1.4 <= took < max_wait_s - 0.5, f"a busy stream's filled batch closed after {took:.1f} s"
    send(45)  # filled within the wait: closed at the wait's end, as before
    events, took = poll((0.3, 30))
    assert events == 75 and wait_s <= took < max_wait_s - 0.5, f"a filled batch closed after {took:.1f} s"
    writer.batches.pipelines.get(("other", "events"), lambda: definition("events"))
    redis_client.sadd(keys.INPUT_STREAMS, keys.member("other", "events"))
    send(20)
    send(1, keys.input_stream_key("other", "events"))  # another tenant's request does not wait on a busy neighbour's batch
    events, took = poll()
    assert events == 21 and wait_s <= took < max_wait_s - 0.5, f"a poll of two tenants' streams closed after {took:.1f} s"
    send(20)  # nor does one that comes while the busy batch waits on: the poll closes on it
    events, took = poll((1.5, 1, keys.input_stream_key("other", "events")))
    assert events == 21 and 1.4 <= took < max_wait_s - 0.5, f"a poll joined by another tenant closed after {took:.1f} s"
