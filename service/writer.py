"""The writer: buffered requests in, Parquet data files out, hand-off to the committer.

Loop: read a batch from every input stream through the `writers` consumer group, run one Spark
job per pipeline, then in one Redis transaction record the files on the table's commit stream,
mark the receipts written and acknowledge (and delete) the input entries. A crash anywhere before
that transaction leaves the entries pending; another writer reclaims them after they idle.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field

import orjson
import redis
from pyarrow import fs as pafs
from pyiceberg.catalog import Catalog
from pyspark.errors import PySparkException
from pyspark.errors.exceptions.connect import SparkConnectGrpcException

from service import faults, metrics
from service.catalog import CATALOG_UNAVAILABLE, create_table_once, load_table
from service.core import keys
from service.core.config import Settings
from service.faults import fault_point
from service.receipts import FAILED, WRITTEN
from service.hand_off import HandOffPlan, HandOffScript
from service.streams import text
from spark_jobs.session import reset_session, spark_session
from spark_jobs.write_events import infer_schema, write_events

log = logging.getLogger(__name__)

READ_COUNT = 200  # entries per XREADGROUP call
MAX_JOB_ATTEMPTS = 3  # for errors that are not a lost connection
BACKOFF_MAX_S = 5.0  # reconnecting is cheap; a long sleep only delays the drain after an outage


@dataclass
class Entry:
    """One buffered HTTP request."""

    id: str
    receipt: str
    events: int
    body: bytes


@dataclass
class Batch:
    """Entries of one input stream, read together."""

    tenant: str
    pipeline: str
    entries: list[Entry] = field(default_factory=list)
    events: int = 0
    size: int = 0

    def add(self, entry: Entry) -> None:
        self.entries.append(entry)
        self.events += entry.events
        self.size += len(entry.body)


@dataclass(frozen=True)
class FilesWritten:
    """The hand-off to the committer: what one Spark job wrote for one table."""

    tenant: str
    table: str
    files: list[str]
    rows_by_receipt: dict[str, int]

    @property
    def rows(self) -> int:
        return sum(self.rows_by_receipt.values())


def consumer_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def parse_entry(entry_id: bytes | str, fields: dict) -> Entry:
    return Entry(
        id=text(entry_id),
        receipt=text(fields[keys.F_RECEIPT.encode()]),
        events=int(fields[keys.F_EVENTS.encode()]),
        body=fields[keys.F_BODY.encode()],
    )


def list_data_files(directory: str) -> list[str]:
    """The Parquet files Spark left in `directory` (not its checksums or markers)."""
    filesystem, path = pafs.FileSystem.from_uri(directory)
    infos = filesystem.get_file_info(pafs.FileSelector(path))
    names = sorted(info.base_name for info in infos if info.is_file)
    return [f"{directory}/{name}" for name in names if name.endswith(".parquet") and not name.startswith((".", "_"))]


class Writer:
    def __init__(self, settings: Settings, client: redis.Redis, catalog: Catalog, name: str | None = None) -> None:
        self.settings = settings
        self.client = client
        self.catalog = catalog
        self.name = name or consumer_name()
        self._groups: set[str] = set()
        self._last_claim = 0.0
        self._hand_off_script = HandOffScript(client)

    # -- the loop ---------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        log.info("writer %s started", self.name)
        while not stop.is_set():
            try:
                for batch in self.poll(stop):
                    self.handle_until_done(batch, stop)
            except redis.RedisError as exc:
                if "NOGROUP" in str(exc):
                    self._groups.clear()  # Redis lost the group (restarted empty): recreate it
                log.warning("writer: Redis unavailable (%s); retrying", exc)
                stop.wait(1.0)
            except Exception:  # noqa: BLE001 - the entries stay pending and are reclaimed; keep the process
                log.exception("writer: unexpected error; the batch stays pending and will be retried")
                stop.wait(1.0)
        log.info("writer %s stopped", self.name)

    def poll(self, stop: threading.Event) -> list[Batch]:
        """Reclaimed entries of dead writers first, else a new batch (blocking up to a second)."""
        reclaimed = self.reclaim_stale()
        if reclaimed:
            return reclaimed
        streams = self._streams()
        if not streams:
            stop.wait(0.5)
            return []
        batches: dict[str, Batch] = {}
        events = size = 0
        deadline = None
        while not stop.is_set():
            block_ms = 1000 if deadline is None else max(1, int((deadline - time.monotonic()) * 1000))
            response = self.client.xreadgroup(
                keys.WRITER_GROUP, self.name, {stream: ">" for stream in streams}, count=READ_COUNT, block=block_ms
            )
            for stream, entries in response or []:
                stream = text(stream)
                for entry_id, fields in entries:
                    entry = parse_entry(entry_id, fields)
                    batch = batches.get(stream)
                    if batch is None:
                        tenant, pipeline = self._owner(stream)
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
            entries = [parse_entry(entry_id, fields) for entry_id, fields in claimed if fields]
            if entries:
                tenant, pipeline = self._owner(stream)
                batch = Batch(tenant, pipeline)
                for entry in entries:
                    batch.add(entry)
                log.info("writer %s reclaimed %d stale entries of %s", self.name, len(entries), stream)
                batches.append(batch)
        return batches

    # -- one batch --------------------------------------------------------------------------

    def handle_until_done(self, batch: Batch, stop: threading.Event) -> None:
        """Write the batch, retrying while Spark is unreachable; the entries stay pending meanwhile."""
        attempt = 0
        failures = 0
        while True:
            try:
                self.handle(batch)
                return
            except SparkConnectGrpcException as exc:
                # The server is down or restarting: keep the entries and wait; nothing is lost.
                attempt += 1
                log.warning("writer: Spark Connect unavailable (%s); retry %d", exc.__class__.__name__, attempt)
                reset_session(self.settings.spark_remote)
            except CATALOG_UNAVAILABLE as exc:
                attempt += 1
                log.warning("writer: catalog unavailable (%s); retry %d", exc, attempt)
            except (PySparkException, OSError) as exc:
                failures += 1
                log.exception("writer: Spark job failed (attempt %d of %d)", failures, MAX_JOB_ATTEMPTS)
                reset_session(self.settings.spark_remote)
                if failures >= MAX_JOB_ATTEMPTS:
                    self.fail(batch, f"Spark job failed {failures} times: {exc}")
                    return
                attempt += 1
            if stop.wait(min(BACKOFF_MAX_S, 0.5 * 2 ** min(attempt, 6))):
                # Shutting down: the entries stay pending for the next writer to reclaim.
                return

    def handle(self, batch: Batch) -> FilesWritten:
        table_name = keys.DEFAULT_TABLE
        spark = spark_session(self.settings.spark_remote)
        bodies = [entry.body for entry in batch.entries]
        table = load_table(self.catalog, batch.tenant, table_name)
        if table is None:
            table = create_table_once(self.catalog, batch.tenant, table_name, infer_schema(spark, bodies))
            log.info("created table %s.%s", batch.tenant, table_name)
        directory = f"{table.location().rstrip('/')}/data/batch-{uuid.uuid4().hex}"
        started = time.perf_counter()
        write_events(spark, bodies, table.schema().as_arrow(), directory)
        metrics.SPARK_JOB_SECONDS.labels(batch.tenant, table_name).observe(time.perf_counter() - started)
        written = FilesWritten(
            tenant=batch.tenant,
            table=table_name,
            files=list_data_files(directory),
            rows_by_receipt={entry.receipt: entry.events for entry in batch.entries},
        )
        fault_point(faults.WRITER_AFTER_SPARK_JOB)
        if self.hand_off(batch, written):
            metrics.EVENTS_WRITTEN.labels(batch.tenant, table_name).inc(written.rows)
        return written

    def hand_off(self, batch: Batch, written: FilesWritten) -> bool:
        """Record the files for the committer and acknowledge the input, atomically, if this
        writer still owns every entry of the batch; False (files orphaned) when it does not."""
        now = f"{time.time():.3f}"
        handed = self._settle(batch, HandOffPlan(
            xadd=[(keys.commit_stream_key(written.tenant, written.table), [
                keys.F_FILES, orjson.dumps(written.files).decode(),
                keys.F_RECEIPTS, orjson.dumps(written.rows_by_receipt).decode(),
                keys.F_ROWS, str(written.rows),
                keys.F_WRITER, self.name,
            ])],
            hset=[
                (keys.receipt_key(batch.tenant, receipt), ["status", WRITTEN, "tables", "1", f"written:{written.table}", str(rows), "written_at", now])
                for receipt, rows in written.rows_by_receipt.items()
            ],
        ))
        if not handed:
            self._discard(batch, written.files)
            return False
        self.client.sadd(keys.TABLES, keys.member(written.tenant, written.table))
        return True

    def fail(self, batch: Batch, reason: str) -> None:
        """Give up on a batch Spark cannot write: keep its bodies on a dead-letter stream, mark receipts failed."""
        handed = self._settle(batch, HandOffPlan(
            hset=[(keys.receipt_key(batch.tenant, entry.receipt), ["status", FAILED, "error", reason]) for entry in batch.entries],
            dead=(keys.dead_stream_key(batch.tenant, batch.pipeline), reason),
            lower_backlog=(keys.backlog_key(batch.tenant), batch.events),
        ))
        if handed:
            log.error("writer: %d requests of %s/%s moved to the dead stream: %s", len(batch.entries), batch.tenant, batch.pipeline, reason)

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
        for path in files:
            try:
                filesystem, location = pafs.FileSystem.from_uri(path)
                filesystem.delete_file(location)
            except OSError:
                log.warning("could not delete orphaned file %s", path)

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

    @staticmethod
    def _owner(stream: str) -> tuple[str, str]:
        # calve:{tenant}:in:{pipeline}
        tag, _, pipeline = stream.partition("}:in:")
        return tag.rpartition("{")[2], pipeline
