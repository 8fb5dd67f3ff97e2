"""The writer: buffered requests in, Parquet data files out, hand-off to the committer.

Loop: read a batch from every input stream through the `writers` consumer group, run one Spark
job per pipeline, then in one Redis transaction record the files on the table's commit stream,
mark the receipts written and acknowledge (and delete) the input entries. Between rounds, run a
compaction a table's leader asked for (compaction.py). A crash anywhere before
that transaction leaves the entries pending; another writer reclaims them after they idle.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections import deque
from datetime import datetime, timezone

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import redis
from pyiceberg.catalog import Catalog
from pyspark.errors.exceptions.connect import SparkConnectGrpcException
from sqlmodel import Session

from service.core import faults, keys, metrics
from service.core.config import Settings
from service.core.db import get_engine
from service.core.exceptions import NotFound
from service.core.faults import fault_point
from service.core.identity import consumer_name
from service.iceberg.catalog import CATALOG_UNAVAILABLE
from service.iceberg.files import catalog_io, delete_files, list_data_files, locate, spark_filesystem
from service.pipelines.spec import PipelineDefinition
from service.pipelines.store import PipelineCache, PipelineRecord, get_pipeline
from service.protocol.commit_entry import FilesWritten
from service.protocol.heartbeats import SPARK_REACHABLE, Heartbeats
from service.protocol.input_entry import InputEntry
from service.protocol.receipts import written_fields
from service.protocol.stream_ids import text
from service.writer.batches import Batch
from service.writer.changes import ChangeApplier, changes_fields
from service.writer.compaction import Compactor
from service.writer.diffs import FeedDiffer
from service.writer.hand_off import HandOffPlan, HandOffScript
from service.writer.spark_errors import (
    is_deterministic,
    is_spark_outage,
    is_transport_error,
)
from service.writer.tables import TableResolver
from spark_jobs.pipeline_job import (
    DLQ_SCHEMA,
    SET_ASIDE_MARK,
    PipelineJob,
    new_directory,
)
from spark_jobs.session import close_sessions, reset_session, spark_session

log = logging.getLogger(__name__)

CLUSTER_POLL_MS = 50  # on a Redis Cluster with several tenants' streams, how long an empty read round sleeps
READ_COUNT = 200  # entries per XREADGROUP call
# A request that fails its job this many times alone goes to the DLQ (the second attempt rules out
# a passing fault, such as an executor lost mid-job).
MAX_JOB_ATTEMPTS = 2
# An entry read this many times without being settled (its writers crashed or were killed while
# handling it, whatever the cause) goes to the DLQ when it is reclaimed once more.
MAX_DELIVERIES = 5
BACKOFF_MAX_S = 5.0  # reconnecting is cheap; a long sleep only delays the drain after an outage
# Per round, batches that failed before get at most RETRY_SHARE of the time the round's new
# batches took, within [RETRY_BUDGET_MIN_S, RETRY_BUDGET_MAX_S] (see Writer.write_round).
RETRY_SHARE = 0.5
RETRY_BUDGET_MIN_S = 0.25
RETRY_BUDGET_MAX_S = 2.0


PROBE_PROMPT_S = 5.0  # a serving Spark Connect answers range(1).collect() well within this


class Writer:
    def __init__(self, settings: Settings, client: redis.Redis, catalog: Catalog, name: str | None = None) -> None:
        self.settings = settings
        self.client = client
        self.catalog = catalog
        self.name = name or consumer_name()
        self._groups: set[str] = set()
        self._last_claim = 0.0
        self._hand_off_script = HandOffScript(client)
        self.engine = get_engine(settings.resolved_database_url())
        # A new pipeline version reaches this writer within pipeline_cache_s.
        self.pipelines = PipelineCache(settings.pipeline_cache_s)
        self.tables = TableResolver(catalog)
        self.io = catalog_io(catalog)
        self._retries: deque[Batch] = deque()  # failed batches still to retry or halve, oldest first
        self._outages = 0  # Spark or catalog calls failed in a row for want of a connection
        self._spark_reachable = True  # as of the last job: false while waiting out a Spark Connect outage
        self.compactor = Compactor(client, catalog, settings.spark_remote, self.name)
        self.applier = ChangeApplier(client, catalog, settings.spark_remote, self.name)
        self.differ = FeedDiffer(client, catalog, settings.spark_remote, self.name)

    # -- the loop ---------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        log.info("writer %s started", self.name)
        heartbeats = Heartbeats(self.client, "writer", self.name)
        while not stop.is_set():
            try:
                heartbeats.beat(**{SPARK_REACHABLE: self._spark_reachable})
                self.write_round(self.poll(stop), stop)
            except redis.RedisError as exc:
                if "NOGROUP" in str(exc):
                    self._groups.clear()  # Redis lost the group (restarted empty): recreate it
                log.warning("writer: Redis unavailable (%s); retrying", exc)
                stop.wait(1.0)
            except Exception:  # noqa: BLE001 - the entries stay pending and are reclaimed; keep the process
                log.exception("writer: unexpected error; the batch stays pending and will be retried")
                stop.wait(1.0)
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
            if not self._retries:
                stop.wait(0.5)
            return []
        batches: dict[str, Batch] = {}
        events = size = 0
        deadline = None
        while not stop.is_set():
            if deadline is None:
                block_ms = 1 if self._retries else 1000  # earlier failures are waiting: only look
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
                    events += entry.events
                    size += len(entry.body)
            if not batches:
                return []
            if deadline is None:
                deadline = time.monotonic() + self.settings.writer_batch_wait_s
            full = events >= self.settings.writer_batch_events or size >= self.settings.writer_batch_bytes
            if full or time.monotonic() >= deadline:
                break
        return list(batches.values())

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
            deliveries = self._deliveries(stream, entries)
            worn_out, batch = Batch(tenant, pipeline), Batch(tenant, pipeline)
            for entry in entries:
                (worn_out if deliveries.get(entry.id, 0) > MAX_DELIVERIES else batch).add(entry)
            if worn_out.entries:
                self.dead_letter(worn_out, f"the request was taken up {MAX_DELIVERIES} times and never written "
                                           "(the writers handling it stopped or crashed)")
            if batch.entries:
                batches.append(batch)
        return batches

    def _deliveries(self, stream: str, entries: list[InputEntry]) -> dict[str, int]:
        """How many times each entry was read (Redis counts every read and every reclaim)."""
        pending = self.client.xpending_range(
            stream, keys.WRITER_GROUP, min=entries[0].id, max=entries[-1].id, count=len(entries), consumername=self.name
        )
        return {text(row["message_id"]): row["times_delivered"] for row in pending}

    # -- one batch --------------------------------------------------------------------------

    def write_round(self, batches: list[Batch], stop: threading.Event) -> None:
        """Write this round's new batches, then spend a bounded share of that time on batches that
        failed before (halved or retried). A tenant whose requests fail thus slows the others by
        RETRY_SHARE at most, never by a whole sequence of isolating failing requests; when nothing
        else is waiting, rounds are short and the retries go on at full speed. New batches of a
        pipeline that has batches waiting to be retried join them: a failing pipeline's traffic
        is served from the retry share only."""
        started = time.monotonic()
        failing = {(batch.tenant, batch.pipeline) for batch in self._retries}
        for batch in batches:
            if stop.is_set():
                return
            if (batch.tenant, batch.pipeline) in failing:
                self._retries.append(batch)
                continue
            self._write(batch, stop)
        spent = time.monotonic() - started
        deadline = time.monotonic() + min(RETRY_BUDGET_MAX_S, max(RETRY_BUDGET_MIN_S, spent * RETRY_SHARE))
        while self._retries and time.monotonic() < deadline and not stop.is_set():
            self._write(self._retries.popleft(), stop)
        # Then the row changes leaders wait for (their tables wait too), and at most one
        # compaction a table's leader asked for (a bounded Spark job).
        while not stop.is_set() and not self._outages and self.applier.run_one():
            pass
        while not stop.is_set() and not self._outages and self.differ.run_one():  # a feed reader waits for each
            pass
        if not stop.is_set() and not self._outages:
            self.compactor.run_one()

    def _write(self, batch: Batch, stop: threading.Event) -> None:
        try:
            self.handle(batch)
            self._outages = 0
            self._spark_reachable = True
            return
        except NotFound as exc:  # the pipeline is gone: no retry can help
            self.dead_letter(batch, str(exc))
            return
        except CATALOG_UNAVAILABLE as exc:
            self._outages += 1
            log.warning("writer: catalog unavailable (%s); retry %d", exc, self._outages)
        except Exception as exc:  # noqa: BLE001 - classified here; no error may stall the writer
            if not is_spark_outage(exc):
                self._retries.extend(self._after_job_failure(batch, exc))
                return
            # The server is down or restarting: keep the entries and wait; nothing is lost.
            self._outages += 1
            self._spark_reachable = False
            log.warning("writer: Spark Connect unavailable (%s); retry %d", exc.__class__.__name__, self._outages)
            reset_session(self.settings.spark_remote)
        self._retries.appendleft(batch)
        # Shutting down meanwhile leaves the entries pending for the next writer to reclaim.
        stop.wait(min(BACKOFF_MAX_S, 0.5 * 2 ** min(self._outages, 6)))

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
        if len(batch.entries) > 1:
            # Types are inferred per batch, so one request (an array sent as a string, say) can
            # make the whole batch's plan fail. Halving isolates the requests that fail alone.
            return batch.halves()
        batch.failures += 1
        # A plan Spark cannot analyse fails the same way every time: one failure alone settles
        # it. Anything else (a task failure, a lost executor) may pass, so it gets a second try.
        if batch.failures < MAX_JOB_ATTEMPTS and not is_deterministic(exc):
            return [batch]
        if is_transport_error(exc) and self._spark_unreachable():
            # Not the request's fault after all: the server stopped under it. Kept, not counted.
            batch.failures -= 1
            self._outages += 1
            log.warning("writer: Spark Connect stopped serving under a job of %s/%s; kept for a retry", batch.tenant, batch.pipeline)
            return [batch]
        attempts = f"{batch.failures} attempt{'s' if batch.failures != 1 else ''}"
        self.dead_letter(batch, f"the Spark job failed with this request alone ({attempts}): {reason}")
        return []

    def handle(self, batch: Batch) -> list[FilesWritten]:
        """Run the batch through its pipeline's current version and hand the files off."""
        # A DLQ replay runs through the pipeline's current version (typically just fixed), so
        # it reads the definition afresh instead of from this writer's cache.
        record = self._pipeline(batch.tenant, batch.pipeline, fresh=any(entry.replays for entry in batch.entries))
        spark = spark_session(self.settings.spark_remote)
        job = PipelineJob(
            spark, batch.pipeline, record.version, record.definition,
            resolve=lambda name, sink, rows: self.tables.resolve(batch.tenant, name, sink, rows),
            dlq_directory=(dlq_directory := new_directory(self.tables.dlq_location(batch.tenant))),
            dlq_filesystem=spark_filesystem(dlq_directory, self.io),
            known_schema=self.tables.known_schema(batch.tenant, record.definition),
        )
        started = time.perf_counter()
        result = job.run([entry.receipt for entry in batch.entries], [entry.body for entry in batch.entries])
        metrics.SPARK_JOB_SECONDS.labels(batch.tenant, batch.pipeline).observe(time.perf_counter() - started)
        if result.direct is not None:
            metrics.DIRECT_BATCHES.labels(batch.tenant, batch.pipeline, result.direct).inc()
        intervals = self._commit_intervals(record.definition)
        written = [
            FilesWritten(batch.tenant, table, list_data_files(output.directory, self.io), output.rows_by_receipt,
                         commit_interval_s=intervals.get(table), **changes_fields(output.changes))
            for table, output in result.tables.items()
        ]
        replayed = [(entry.receipt, dlq_id) for entry in batch.entries for dlq_id in entry.replays]
        if result.dlq is not None or replayed:
            # Replayed entries leave the DLQ in the DLQ table's commit of this very batch (which
            # also holds the batch's new DLQ rows, a replayed event that fails again among them).
            dlq_rows = dict(result.dlq.rows_by_receipt) if result.dlq is not None else {}
            for receipt, _dlq_id in replayed:
                dlq_rows.setdefault(receipt, 0)
            written.append(FilesWritten(
                batch.tenant, keys.DLQ_TABLE, list_data_files(result.dlq.directory, self.io) if result.dlq is not None else [],
                dlq_rows, deletes=[dlq_id for _receipt, dlq_id in replayed],
            ))
        dropped: dict[str, dict[str, list[str]]] = {}  # receipt -> table -> names
        dropping = 0
        for table, output in result.tables.items():
            for receipt, (names, events) in output.dropped_by_receipt.items():
                dropped.setdefault(receipt, {})[table] = names
                dropping += events
        fault_point(faults.WRITER_AFTER_SPARK_JOB)
        if self.hand_off(batch, written, dropped):
            for files in written:
                metrics.EVENTS_WRITTEN.labels(batch.tenant, files.table).inc(files.rows)
            if dropping:
                metrics.EVENTS_WITH_DROPPED_FIELDS.labels(batch.tenant, batch.pipeline).inc(dropping)
        return written

    @staticmethod
    def _commit_intervals(definition: PipelineDefinition) -> dict[str, float]:
        """Static tables whose sink sets a commit interval (the shortest wins)."""
        intervals: dict[str, float] = {}
        for sink in definition.sinks:
            if sink.commit_interval and not sink.dynamic:
                intervals[sink.table] = min(sink.commit_interval, intervals.get(sink.table, sink.commit_interval))
        return intervals

    def _pipeline(self, tenant: str, name: str, fresh: bool = False) -> PipelineRecord:
        def load() -> PipelineRecord:
            with Session(self.engine) as session:
                return get_pipeline(session, tenant, name)

        if fresh:
            self.pipelines.forget((tenant, name))
        return self.pipelines.get((tenant, name), load)

    def hand_off(self, batch: Batch, written: list[FilesWritten], dropped: dict[str, dict[str, list[str]]] | None = None) -> bool:
        """Record the files for the committer and acknowledge the input, atomically, if this
        writer still owns every entry of the batch; False (files orphaned) when it does not.

        A receipt whose events went to no table (all filtered out or routed nowhere) is complete
        now: it is marked committed here and leaves the backlog."""
        now = f"{time.time():.3f}"
        tables_by_receipt: dict[str, dict[str, int]] = {}
        for files in written:
            for receipt, rows in files.rows_by_receipt.items():
                tables_by_receipt.setdefault(receipt, {})[files.table] = rows
        hset, done_events, done = [], 0, []
        for entry in batch.entries:
            tables = tables_by_receipt.get(entry.receipt, {})
            if not tables:
                done_events += entry.events
                done.append(entry.receipt)
            hset.append((keys.receipt_key(batch.tenant, entry.receipt), written_fields(tables, now, (dropped or {}).get(entry.receipt))))
        handed = self._settle(batch, HandOffPlan(
            xadd=[
                (keys.commit_stream_key(files.tenant, files.table), files.to_fields(self.name))
                for files in written
            ],
            hset=hset,
            lower_backlog=(keys.backlog_key(batch.tenant), done_events) if done_events else None,
        ))
        if not handed:
            self._discard(batch, [path for files in written for path in files.files])
            return False
        if written:
            self.client.sadd(keys.TABLES, *[keys.member(files.tenant, files.table) for files in written])
        if done:
            self.client.publish(keys.COMMITTED_CHANNEL, orjson.dumps(done))
        return True

    def dead_letter(self, batch: Batch, reason: str) -> None:
        """Send every event of requests no job could write to the tenant's DLQ table, with the
        reason, where `GET /v1/dlq` shows them and a replay can retry them. The file is written
        here with pyarrow, not by Spark: Spark may be what fails on these events."""
        now = datetime.now(timezone.utc)
        version = self._pipeline_version(batch)
        columns: dict[str, list] = {name: [] for name in DLQ_SCHEMA.names}
        rows_by_receipt: dict[str, int] = {}
        for entry in batch.entries:
            for line in entry.body.split(b"\n"):
                if not line:
                    continue
                event, why = line.decode(errors="replace"), reason
                if line.startswith(SET_ASIDE_MARK.encode()):
                    wrapped = orjson.loads(line[1:])
                    event, why = wrapped["event"], wrapped["reason"]
                row = {keys.DLQ_ID: str(uuid.uuid4()), "event": event, "reason": why, "pipeline": batch.pipeline,
                       "pipeline_version": version, "table": None, "receipt": entry.receipt, "failed_at": now}
                for name, value in row.items():
                    columns[name].append(value)
                rows_by_receipt[entry.receipt] = rows_by_receipt.get(entry.receipt, 0) + 1
        path = f"{new_directory(self.tables.dlq_location(batch.tenant))}/part-00000.parquet"
        filesystem, location = locate(path, self.io)
        filesystem.create_dir(location.rsplit("/", 1)[0])
        pq.write_table(pa.table(columns, schema=DLQ_SCHEMA), location, filesystem=filesystem, compression="zstd")
        deletes = [dlq_id for entry in batch.entries for dlq_id in entry.replays]
        written = [FilesWritten(batch.tenant, keys.DLQ_TABLE, [path], rows_by_receipt, deletes=deletes)]
        if self.hand_off(batch, written):
            metrics.EVENTS_WRITTEN.labels(batch.tenant, keys.DLQ_TABLE).inc(sum(rows_by_receipt.values()))
            log.error("writer: %d requests of %s/%s sent to the DLQ: %s", len(batch.entries), batch.tenant, batch.pipeline, reason)

    def _pipeline_version(self, batch: Batch) -> int:
        try:
            return self._pipeline(batch.tenant, batch.pipeline).version
        except NotFound:
            return 0

    def _settle(self, batch: Batch, plan: HandOffPlan) -> bool:
        stream = keys.input_stream_key(batch.tenant, batch.pipeline)
        return bool(self._hand_off_script.run(self.client, stream, keys.WRITER_GROUP, self.name, [entry.id for entry in batch.entries], plan))

    def _discard(self, batch: Batch, files: list[str]) -> None:
        # Another writer reclaimed the entries (this one looked dead: a job longer than the claim
        # idle time) and wrote or is writing them itself. These files are never committed.
        log.warning(
            "writer %s: %d entries of %s/%s were taken over by another writer; discarding %d files it will not commit",
            self.name, len(batch.entries), batch.tenant, batch.pipeline, len(files),
        )
        metrics.BATCHES_SUPERSEDED.labels(batch.tenant, batch.pipeline).inc()
        delete_files(files, self.io)

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
                    if "BUSYGROUP" not in str(exc):
                        raise
                self._groups.add(stream)
            streams.append(stream)
        return streams

