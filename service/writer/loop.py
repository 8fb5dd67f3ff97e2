"""The writer: buffered requests in, Parquet data files out, hand-off to the committer.

Loop: read a batch from every input stream through the `writers` consumer group, run one Spark
job per pipeline, then in one Redis transaction record the files on the table's commit stream,
mark the receipts written and acknowledge (and delete) the input entries. Between rounds, run the
row changes and feed diffs a table's leader asked for (changes.py, diffs.py); beside the rounds,
on a thread of their own, the compactions it asked for (compaction.py). A crash anywhere before
that transaction leaves the entries pending; another writer reclaims them after they idle.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque

import redis
from pyiceberg.catalog import Catalog
from pyspark.errors.exceptions.connect import SparkConnectGrpcException

from service.core import keys
from service.core.config import Settings
from service.core.connections import redis_error_code
from service.core.exceptions import NotFound
from service.core.identity import consumer_name
from service.iceberg.catalog import CATALOG_UNAVAILABLE
from service.protocol.heartbeats import SPARK_REACHABLE, Heartbeats
from service.protocol.input_entry import InputEntry
from service.protocol.stream_ids import text
from service.writer.batch_writer import BatchWriter
from service.writer.batches import Batch, pending_of
from service.writer.changes import ChangeApplier
from service.writer.compaction import Compactor
from service.writer.diffs import FeedDiffer
from service.writer.lanes import Lanes, keep_pending, kept_pending
from service.writer.retries import NextStep, after_job_failure, retry_budget_s
from spark_jobs.session import close_sessions, reset_session, spark_session
from spark_jobs.spark_errors import (
    is_spark_outage,
    is_transport_error,
)

log = logging.getLogger(__name__)

CLUSTER_POLL_MS = 50  # on a Redis Cluster with several tenants' streams, how long an empty read round sleeps
READ_COUNT = 200  # entries per XREADGROUP call
# An entry read this many times without being settled (its writers crashed or were killed while
# handling it, whatever the cause) goes to the DLQ when it is reclaimed once more.
MAX_DELIVERIES = 5
IDLE_POLL_S = 1.0  # with nothing to write, how long a poll waits for entries before the loop comes round
LEADER_POLL_MS = 25  # meanwhile, how often it looks for a leader's request (a producer waits on each run of row changes)
SET_ASIDE_POLL_MS = 250  # with batches set aside for a lane, how long a read waits for new entries
BACKOFF_MAX_S = 5.0  # reconnecting is cheap; a long sleep only delays the drain after an outage


COMPACTION_POLL_S = 1.0  # how often the compactions' thread looks for a request (upkeep plans them minutes apart)

PROBE_PROMPT_S = 5.0  # a serving Spark Connect answers range(1).collect() well within this


class Writer:
    def __init__(self, settings: Settings, client: redis.Redis, catalog: Catalog, name: str | None = None) -> None:
        self.settings = settings
        self.client = client
        self.catalog = catalog
        self.name = name or consumer_name()
        self._groups: set[str] = set()
        self._last_claim = 0.0
        self.batches = BatchWriter(settings, client, catalog, self.name)
        self._retries: deque[Batch] = deque()  # failed batches still to retry or halve, oldest first
        self.lanes = Lanes(client, self.name)
        self._set_aside: list[Batch] = []  # heavy batches whose tenant's lane another writer held
        self._writing: list[Batch] = []  # the batch whose job runs now (out of every list above meanwhile)
        self._outages = 0  # Spark or catalog calls failed in a row for want of a connection
        self._spark_reachable = True  # as of the last job: false while waiting out a Spark Connect outage
        self.compactor = Compactor(client, catalog, settings.spark_remote, self.name, settings.compact_tasks)
        self.applier = ChangeApplier(client, catalog, settings.spark_remote, self.name, settings.compact_tasks)
        self.differ = FeedDiffer(client, catalog, settings.spark_remote, self.name, settings.compact_tasks)

    # -- the loop ---------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        log.info("writer %s started", self.name)
        heartbeats = Heartbeats(self.client, "writer", self.name)
        compactions = threading.Thread(target=self.compact, args=(stop,), name="compactions", daemon=True)
        compactions.start()
        while not stop.is_set():
            try:
                heartbeats.beat(**{SPARK_REACHABLE: self._spark_reachable})
                self.write_round(self.poll(stop), stop)
            except redis.RedisError as exc:
                if redis_error_code(exc) == "NOGROUP":
                    self._groups.clear()  # Redis lost the group (restarted empty): recreate it
                log.warning("writer: Redis unavailable (%s); retrying", exc)
                stop.wait(1.0)
            except Exception:
                log.exception("writer: unexpected error; the batch stays pending and will be retried")
                stop.wait(1.0)
        # A compaction under way ends first, as the batch under way did; one that outlasts half the
        # grace fails when its session closes, and its table's leader plans it again.
        compactions.join(self.settings.shutdown_grace_s / 2)
        close_sessions()
        with contextlib.suppress(redis.RedisError):
            heartbeats.stop()
        log.info("writer %s stopped", self.name)

    def poll(self, stop: threading.Event) -> list[Batch]:
        """Reclaimed entries of dead writers first, else a new batch (blocking up to a second)."""
        reclaimed = self.reclaim_stale()
        if reclaimed:
            return reclaimed
        streams = self._streams()
        if not streams:
            if not self._retries and not self._set_aside:
                stop.wait(0.5)
            return []
        batches: dict[str, Batch] = {}
        deadline = None
        extended = False
        idle_until = time.monotonic() + IDLE_POLL_S
        while not stop.is_set():
            if deadline is None:
                # Earlier failures are waiting: only look. Set-aside batches wait for a lane: look a
                # while. Otherwise wait for entries in slices, between which a leader's request
                # (row changes, a feed's diff: a table or a reader waits on each) ends the wait.
                if self._retries:
                    block_ms = 1
                elif self._set_aside:
                    block_ms = SET_ASIDE_POLL_MS
                elif self.applier.waiting() or self.differ.waiting() or time.monotonic() >= idle_until:
                    return []
                else:
                    block_ms = LEADER_POLL_MS
            else:
                block_ms = max(1, int((deadline - time.monotonic()) * 1000))
            for stream, entries in self._read(streams, block_ms):
                stream = text(stream)
                for entry_id, fields in entries:
                    entry = InputEntry.from_fields(entry_id, fields)
                    batch = batches.get(stream)
                    if batch is None:
                        tenant, pipeline = keys.parse_input_stream_key(stream)
                        batch = batches[stream] = Batch(tenant, pipeline)
                    batch.add(entry)
            if not batches:
                if self._retries or self._set_aside:
                    return []
                continue
            if deadline is None:
                opened = time.monotonic()
                deadline = opened + self.settings.writer_batch_wait_s
            events = sum(batch.events for batch in batches.values())
            size = sum(batch.size for batch in batches.values())
            full = events >= self.settings.writer_batch_events or size >= self.settings.writer_batch_bytes
            if full or self._changes_only(batches):
                break
            if extended and not self._fills(batches, events):
                break
            if time.monotonic() >= deadline:
                if extended or not self._fills(batches, events):
                    break
                extended, deadline = True, opened + self.settings.writer_batch_max_wait_s
        return list(batches.values())

    def _fills(self, batches: dict[str, Batch], events: int) -> bool:
        """Whether a poll holding `batches` (`events` in all) waits on, past the batch wait, to
        fill: it read one stream, a busy one (an eighth of writer_batch_fill_events came in the
        wait: 7,500 events, 30,000 a second, by default) whose batch is not yet full, and a Spark
        job's cost, the same whatever it holds, would be a large share of that batch's (an OTLP
        load's jobs held ~16,000 events: ~0.85 of its 2.3 CPU-s per 100,000 went to the jobs'
        fixed cost; filled to 30,000 events, ~37,000 a job, against ~56,000 filled to 60,000). A
        quiet stream's events are not held for longer than the wait, nor are another tenant's: a
        poll that reads a second stream, or a writer with failed or set-aside batches waiting,
        closes then, in the wait or after it (make chaos's poison_tenant: its neighbours' p50
        tripled when they waited on a flooding tenant's batch to fill)."""
        fill = self.settings.writer_batch_fill_events
        return (len(batches) == 1 and not self._retries and not self._set_aside and fill / 8 <= events < fill
                and self.settings.writer_batch_max_wait_s > self.settings.writer_batch_wait_s)

    def _changes_only(self, batches: dict[str, Batch]) -> bool:
        """Whether every batch read so far is of a pipeline that changes rows: its events wait
        for the table's next run of changes (committer/changes.py), which takes every change
        queued by then, so waiting here for more to batch would only add to their latency."""
        try:
            return all(self.batches.pipeline(batch.tenant, batch.pipeline).definition.changes_rows for batch in batches.values())
        except Exception:  # noqa: BLE001 - gone, or the DB away: the batch's job meets that, as before
            return False

    def _read(self, streams: list[str], block_ms: int) -> list:
        """New entries of `streams`, waiting up to `block_ms` for some. On a Redis Cluster, which
        serves one slot per command, each tenant's streams (one slot: their hash tag) are read
        by a command of their own, without blocking, and an empty round sleeps instead."""
        by_tenant: dict[str, dict[str, str]] = {}
        for stream in streams:
            by_tenant.setdefault(keys.parse_input_stream_key(stream)[0], {})[stream] = ">"
        if len(by_tenant) == 1 or not self.settings.redis_cluster:
            return self.client.xreadgroup(keys.WRITER_GROUP, self.name, dict.fromkeys(streams, ">"), count=READ_COUNT, block=block_ms) or []
        response = []
        for tenant_streams in by_tenant.values():
            response += self.client.xreadgroup(keys.WRITER_GROUP, self.name, tenant_streams, count=READ_COUNT) or []
        if not response:
            time.sleep(min(block_ms, CLUSTER_POLL_MS) / 1000)
        return response

    def reclaim_stale(self) -> list[Batch]:
        """Take over entries that a crashed writer read but never acknowledged."""
        now = time.monotonic()
        if now - self._last_claim < self.settings.writer_claim_idle_s / 2:
            return []
        self._last_claim = now
        batches = []
        idle_ms = int(self.settings.writer_claim_idle_s * 1000)
        for stream in self._streams():
            _next, claimed, deleted = self.client.xautoclaim(
                stream, keys.WRITER_GROUP, self.name, min_idle_time=idle_ms, start_id="0-0", count=READ_COUNT
            )
            if deleted:
                self.client.xack(stream, keys.WRITER_GROUP, *deleted)
            entries = [InputEntry.from_fields(entry_id, fields) for entry_id, fields in claimed if fields]
            if not entries:
                continue
            tenant, pipeline = keys.parse_input_stream_key(stream)
            log.info("writer %s reclaimed %d stale entries of %s", self.name, len(entries), stream)
            # How many times each was read (Redis counts every read and every reclaim).
            deliveries = {entry_id: row["times_delivered"] for entry_id, row in pending_of(self.client, stream, entries, self.name).items()}
            worn_out, batch = Batch(tenant, pipeline), Batch(tenant, pipeline)
            for entry in entries:
                (worn_out if deliveries.get(entry.id, 0) > MAX_DELIVERIES else batch).add(entry)
            if worn_out.entries:
                self.batches.dead_letter(worn_out, f"the request was taken up {MAX_DELIVERIES} times and never written "
                                           "(the writers handling it stopped or crashed)")
            if batch.entries:
                batches.append(batch)
        return batches

    # -- one batch --------------------------------------------------------------------------

    def write_round(self, batches: list[Batch], stop: threading.Event) -> None:
        """Write this round's new batches, then spend a bounded share of that time on batches that
        failed before (halved or retried). A tenant whose requests fail thus slows the others by
        RETRY_SHARE at most, never by a whole sequence of isolating failing requests; when nothing
        else is waiting, rounds are short and the retries go on at full speed. New batches of a
        pipeline that has batches waiting to be retried join them: a failing pipeline's traffic
        is served from the retry share only.

        Batches of pipelines whose last job was quick go first; a heavy batch runs only in its
        tenant's lane (lanes.py), and waits set aside while another writer holds it. Meanwhile
        the entries of them all stay this writer's (kept_pending)."""
        waiting, self._set_aside = self._set_aside, []
        self._retries.extendleft(reversed([batch for batch in waiting if batch.failures]))
        batches = sorted([*[batch for batch in waiting if not batch.failures], *batches], key=self.lanes.expected_s)
        # The batch being written too: a retry is popped off _retries for its job, which may take
        # long (the Spark Connect client retries a stopped server for tens of seconds, and so may
        # the probe after it). Left out, its entries went idle, the other writer reclaimed them,
        # each reclaim counted a delivery, and after MAX_DELIVERIES the request went to the DLQ
        # though nothing was wrong with it (make test's spark_stopped lost a request so, once).
        held = lambda: [*batches, *self._retries, *self._set_aside, *self._writing]  # noqa: E731
        with kept_pending(self.client, self.name, held, self.settings.writer_claim_idle_s / 3):
            self._write_round(batches, stop)

    def _write_round(self, batches: list[Batch], stop: threading.Event) -> None:
        started = time.monotonic()
        failing = {(batch.tenant, batch.pipeline) for batch in self._retries}
        tenants = {batch.tenant for batch in batches}
        for batch in batches:
            if stop.is_set():
                return
            if (batch.tenant, batch.pipeline) in failing:
                self._retries.append(batch)
                continue
            self._write(batch, stop, crowded=len(tenants) > 1)
        spent = time.monotonic() - started
        deadline = time.monotonic() + retry_budget_s(spent)
        while self._retries and time.monotonic() < deadline and not stop.is_set():
            self._write(self._retries.popleft(), stop)
        # Then the row changes leaders wait for (their tables wait too). Compactions run beside.
        while not stop.is_set() and not self._outages and self.applier.run_one(stop):
            pass
        while not stop.is_set() and not self._outages and self.differ.run_one(stop):  # a feed reader waits for each
            pass

    def compact(self, stop: threading.Event) -> None:
        """The compactions tables' leaders ask for, one at a time, on this thread beside the
        batches: a compaction (up to compact_max_bytes, a minute or more of Spark's time) held
        up this writer's batches while it ran between them, and with one writer every tenant's
        ingest. Its jobs take compact_tasks of Spark's cores, its session's own setting; the
        batches' jobs run on the cores left. None starts while the batches wait out an outage."""
        while not stop.is_set():
            try:
                if self._outages or not self.compactor.run_one(stop):
                    stop.wait(COMPACTION_POLL_S)
            except Exception:  # Redis away or worse: the compacting key lapses and the leader plans it again; this thread goes on
                log.exception("writer: the compactions' thread met an error; it goes on")
                stop.wait(COMPACTION_POLL_S)

    def _write(self, batch: Batch, stop: threading.Event, crowded: bool = False) -> None:
        with self.lanes.lane(batch, crowded) as may_run:
            if not may_run:
                self._set_aside.append(batch)
                keep_pending(self.client, batch, self.name)
                return
            started = time.monotonic()
            self._writing.append(batch)
            full = True  # unless it was written all the short way (a job that failed counts as full)
            try:
                full = self._write_batch(batch, stop)
            finally:
                self._writing.remove(batch)
                self.lanes.ran(batch, time.monotonic() - started, full)

    def _write_batch(self, batch: Batch, stop: threading.Event) -> bool:
        """Write it, or settle what is left to try of it: whether the full Spark job wrote some of it
        or its job failed (lanes.py: such a pipeline's slow batches take its tenant's lane)."""
        try:
            full = self.batches.write(batch).full_job
            self._outages = 0
            self._spark_reachable = True
            return full
        except NotFound as exc:  # the pipeline is gone: no retry can help
            self.batches.dead_letter(batch, str(exc))
            return True
        except CATALOG_UNAVAILABLE as exc:
            self._outages += 1
            log.warning("writer: catalog unavailable (%s); retry %d", exc, self._outages)
        except Exception as exc:  # noqa: BLE001 - classified here; no error may stall the writer
            if not is_spark_outage(exc):
                self._retries.extend(self._after_job_failure(batch, exc))
                return True
            # The server is down or restarting: keep the entries and wait; nothing is lost.
            self._outages += 1
            self._spark_reachable = False
            log.warning("writer: Spark Connect unavailable (%s); retry %d", exc.__class__.__name__, self._outages)
            reset_session(self.settings.spark_remote)
        self._retries.appendleft(batch)
        # Shutting down meanwhile leaves the entries pending for the next writer to reclaim.
        stop.wait(min(BACKOFF_MAX_S, 0.5 * 2 ** min(self._outages, 6)))
        return False  # no job ran: an outage says nothing of the batch

    def _spark_unreachable(self) -> bool:
        """Whether Spark Connect fails a trivial query right now: a broken exchange while the
        server stops (a cancelled stream, a reset connection) looks like any other transport
        error, and must not send the request to the DLQ. Asked only before dead-lettering (one
        query per request that failed alone), not at each halving."""
        started = time.monotonic()
        try:
            spark_session(self.settings.spark_remote).range(1).collect()
        except Exception:  # noqa: BLE001 - any failure of the probe means the server is not serving
            return True
        # The client retries while the server is away, so a probe that answers only after a wait
        # was made while the server restarted: the job failed for that, not for its request
        # (make chaos's spark_stopped sent a request to the DLQ after a 21 s probe that succeeded).
        return time.monotonic() - started > PROBE_PROMPT_S

    def _after_job_failure(self, batch: Batch, exc: Exception) -> list[Batch]:
        """What is left to try of a batch whose job failed (Spark refused it, a task failed, or
        anything else went wrong while writing it)."""
        reason = (str(exc).strip().splitlines() or [exc.__class__.__name__])[0][:1000]
        log.warning("writer: job of %d requests of %s/%s failed: %s", len(batch.entries), batch.tenant, batch.pipeline, reason)
        if type(exc) is SparkConnectGrpcException:
            # Not an error Spark answered about the job but a broken exchange (a message too deep
            # to decode, a deadline): start the next attempt on a fresh channel.
            reset_session(self.settings.spark_remote)
        elif not isinstance(exc, SparkConnectGrpcException):
            log.warning("writer: the failure came from outside Spark", exc_info=exc)
        step = after_job_failure(batch, exc)
        if step is NextStep.HALVE:
            return batch.halves()
        if step is NextStep.RETRY:
            return [batch]
        if is_transport_error(exc) and self._spark_unreachable():
            # Not the request's fault after all: the server stopped under it. Kept, not counted.
            batch.failures -= 1
            self._outages += 1
            log.warning("writer: Spark Connect stopped serving under a job of %s/%s; kept for a retry", batch.tenant, batch.pipeline)
            return [batch]
        attempts = f"{batch.failures} attempt{'s' if batch.failures != 1 else ''}"
        self.batches.dead_letter(batch, f"the Spark job failed with this request alone ({attempts}): {reason}")
        return []

    # -- streams ----------------------------------------------------------------------------

    def _streams(self) -> list[str]:
        streams = []
        for member in self.client.smembers(keys.INPUT_STREAMS):
            tenant, pipeline = keys.split_member(text(member))
            stream = keys.input_stream_key(tenant, pipeline)
            if stream not in self._groups:
                try:
                    self.client.xgroup_create(stream, keys.WRITER_GROUP, id="0", mkstream=True)
                except redis.ResponseError as exc:
                    if redis_error_code(exc) != "BUSYGROUP":
                        raise
                self._groups.add(stream)
            streams.append(stream)
        return streams

