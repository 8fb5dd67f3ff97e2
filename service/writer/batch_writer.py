"""One batch through its pipeline: the Spark job (spark_jobs/pipeline_job.py), then the hand-off
of its files to the committer; or, for requests no job can write, straight to the DLQ."""

from __future__ import annotations

import logging
import time

import orjson
import redis
from pyiceberg.catalog import Catalog
from sqlmodel import Session

from service.core import faults, keys, metrics
from service.core.config import Settings
from service.core.connections import tasks_redis_url
from service.core.db import get_engine
from service.core.exceptions import NotFound
from service.core.faults import fault_point
from service.iceberg.files import catalog_io, delete_files, list_data_files, locate, spark_filesystem
from service.pipelines.spec import PipelineDefinition
from service.pipelines.store import PipelineCache, PipelineRecord, get_pipeline
from service.protocol.commit_entry import CommitEntry
from service.protocol.receipts import written_fields
from service.writer.batches import Batch
from service.writer.changes import changes_fields
from service.writer.hand_off import HandOffPlan, HandOffScript
from service.writer.outcome import BatchOutcome
from service.writer.tables import TableResolver
from spark_jobs.dlq import dead_letter_requests
from spark_jobs.otlp_rows import as_lines
from spark_jobs.pipeline_job import PipelineJob
from spark_jobs.session import spark_session
from spark_jobs.stream_bodies import StreamEntries
from spark_jobs.targets import JobResult, new_directory

log = logging.getLogger(__name__)


class BatchWriter:
    def __init__(self, settings: Settings, client: redis.Redis, catalog: Catalog, name: str) -> None:
        self.settings = settings
        self.client = client
        self.name = name
        self.engine = get_engine(settings.resolved_database_url())
        # A new pipeline version reaches this writer within pipeline_cache_s.
        self.pipelines = PipelineCache(settings.pipeline_cache_s)
        self.tables = TableResolver(catalog, settings.max_table_columns)
        self.io = catalog_io(catalog)
        self._hand_off_script = HandOffScript(client)

    def write(self, batch: Batch) -> BatchOutcome:
        """Run the batch through its pipeline's current version and hand the files off."""
        # A DLQ replay runs through the pipeline's current version (typically just fixed), so
        # it reads the definition afresh instead of from this writer's cache.
        record = self.pipeline(batch.tenant, batch.pipeline, fresh=any(entry.replays for entry in batch.entries))
        self.tables.new_batch()
        job = PipelineJob(
            spark_session(self.settings.spark_remote), batch.pipeline, record.version, record.definition,
            resolve=lambda name, sink, rows: self.tables.resolve(batch.tenant, name, sink, rows),
            dlq_directory=(dlq_directory := new_directory(self.tables.dlq_location(batch.tenant))),
            dlq_filesystem=spark_filesystem(dlq_directory, self.io),
            known_schema=self.tables.known_schema(batch.tenant, record.definition),
            processed_table=self.tables.known_schema(batch.tenant, record.definition, processors=True) is not None,
            evolving_table=self.tables.evolving_table(batch.tenant, record.definition),
            routed_tables=self.tables.routed_tables(batch.tenant, record.definition),
            refusals_key=keys.member(batch.tenant, batch.pipeline),
            max_columns=self.settings.max_table_columns, task_bytes=self.settings.writer_task_bytes,
        )
        started = time.perf_counter()
        result = job.run([entry.receipt for entry in batch.entries], [entry.body for entry in batch.entries], self._entries(batch))
        metrics.SPARK_JOB_SECONDS.labels(batch.tenant, batch.pipeline).observe(time.perf_counter() - started)
        if result.direct is not None:
            metrics.DIRECT_BATCHES.labels(batch.tenant, batch.pipeline, result.direct).inc()
        if result.bodies is not None:
            metrics.DIRECT_BODIES.labels(batch.tenant, batch.pipeline, result.bodies).inc()
        outcome = self._outcome(batch, record.definition, result)
        outcome.full_job = result.direct != "written"
        fault_point(faults.WRITER_AFTER_SPARK_JOB)
        if self.hand_off(batch, outcome):
            for entry in outcome.entries:
                metrics.EVENTS_WRITTEN.labels(batch.tenant, entry.table).inc(entry.rows)
            if outcome.dropped_events:
                metrics.EVENTS_WITH_DROPPED_FIELDS.labels(batch.tenant, batch.pipeline).inc(outcome.dropped_events)
            if outcome.nulled_events:
                metrics.EVENTS_WITH_NULLED_VALUES.labels(batch.tenant, batch.pipeline).inc(outcome.nulled_events)
        return outcome

    def _entries(self, batch: Batch) -> StreamEntries | None:
        """Where Spark's tasks may read the batch's bodies themselves (None: ship them)."""
        if not self.settings.spark_reads_redis:
            return None
        try:
            url = tasks_redis_url(self.settings)
        except redis.RedisError as exc:  # the sentinels cannot name the master now
            log.warning("writer: no Redis address for Spark's tasks (%s); the bodies are shipped", exc)
            return None
        stream = keys.input_stream_key(batch.tenant, batch.pipeline)
        return StreamEntries(url, self.settings.redis_cluster, stream, tuple(entry.id for entry in batch.entries))

    def _outcome(self, batch: Batch, definition: PipelineDefinition, result: JobResult) -> BatchOutcome:
        outcome = BatchOutcome()
        intervals = commit_intervals(definition)
        for table, output in result.tables.items():
            files = [path for directory in output.directories for path in list_data_files(directory, self.io)]
            outcome.add(CommitEntry(batch.tenant, table, files, output.rows_by_receipt,
                                    commit_interval_s=intervals.get(table), **changes_fields(output.changes)), output.dropped_by_receipt,
                        output.nulled_by_receipt)
        replayed = [(entry.receipt, dlq_id) for entry in batch.entries for dlq_id in entry.replays]
        if result.dlq is not None or replayed:
            # Replayed entries leave the DLQ in the DLQ table's commit of this very batch (which
            # also holds the batch's new DLQ rows, a replayed event that fails again among them).
            dlq_rows = dict(result.dlq.rows_by_receipt) if result.dlq is not None else {}
            for receipt, _dlq_id in replayed:
                dlq_rows.setdefault(receipt, 0)
            outcome.add(CommitEntry(
                batch.tenant, keys.DLQ_TABLE, list_data_files(result.dlq.directory, self.io) if result.dlq is not None else [],
                dlq_rows, deletes=[dlq_id for _receipt, dlq_id in replayed],
            ))
        return outcome

    def dead_letter(self, batch: Batch, reason: str) -> None:
        """Send every event of requests no job could write to the tenant's DLQ table, with the
        reason, where `GET /v1/dlq` shows them and a replay can retry them. The file is written
        here with pyarrow, not by Spark: Spark may be what fails on these events."""
        path = f"{new_directory(self.tables.dlq_location(batch.tenant))}/part-00000.parquet"
        filesystem, location = locate(path, self.io)
        rows_by_receipt = dead_letter_requests(
            [(entry.receipt, as_lines(entry.body)) for entry in batch.entries], reason, batch.pipeline, self._pipeline_version(batch), location, filesystem,
        )
        outcome = BatchOutcome()
        outcome.add(CommitEntry(batch.tenant, keys.DLQ_TABLE, [path], rows_by_receipt,
                                deletes=[dlq_id for entry in batch.entries for dlq_id in entry.replays]))
        if self.hand_off(batch, outcome):
            metrics.EVENTS_WRITTEN.labels(batch.tenant, keys.DLQ_TABLE).inc(sum(rows_by_receipt.values()))
            log.error("writer: %d requests of %s/%s sent to the DLQ: %s", len(batch.entries), batch.tenant, batch.pipeline, reason)

    def hand_off(self, batch: Batch, outcome: BatchOutcome) -> bool:
        """Record the files for the committer and acknowledge the input, atomically, if this
        writer still owns every entry of the batch; False (files orphaned) when it does not.

        A receipt whose events went to no table (all filtered out or routed nowhere) is complete
        now: it is marked committed here and leaves the backlog."""
        now = f"{time.time():.3f}"
        hset, done_events, done = [], 0, []
        for entry in batch.entries:
            share = outcome.receipt(entry.receipt)
            if not share.rows_by_table:
                done_events += entry.events
                done.append(entry.receipt)
            fields = written_fields(share.rows_by_table, now, share.dropped_by_table, share.nulled_by_table)
            hset.append((keys.receipt_key(batch.tenant, entry.receipt), fields))
        plan = HandOffPlan(
            xadd=[(keys.commit_stream_key(written.tenant, written.table), written.to_fields(self.name)) for written in outcome.entries],
            hset=hset,
            lower_backlog=(keys.backlog_key(batch.tenant), done_events) if done_events else None,
        )
        stream = keys.input_stream_key(batch.tenant, batch.pipeline)
        if not self._hand_off_script.run(self.client, stream, keys.WRITER_GROUP, self.name, [entry.id for entry in batch.entries], plan):
            self._discard(batch, outcome.files)
            return False
        if outcome.entries:
            self.client.sadd(keys.TABLES, *[keys.member(written.tenant, written.table) for written in outcome.entries])
        if done:
            self.client.publish(keys.COMMITTED_CHANNEL, orjson.dumps(done))
        return True

    def _discard(self, batch: Batch, files: list[str]) -> None:
        # Another writer reclaimed the entries (this one looked dead: a job longer than the claim
        # idle time) and wrote or is writing them itself. These files are never committed.
        log.warning(
            "writer %s: %d entries of %s/%s were taken over by another writer; discarding %d files it will not commit",
            self.name, len(batch.entries), batch.tenant, batch.pipeline, len(files),
        )
        metrics.BATCHES_SUPERSEDED.labels(batch.tenant, batch.pipeline).inc()
        delete_files(files, self.io)

    def pipeline(self, tenant: str, name: str, fresh: bool = False) -> PipelineRecord:
        def load() -> PipelineRecord:
            with Session(self.engine) as session:
                return get_pipeline(session, tenant, name)

        if fresh:
            self.pipelines.forget((tenant, name))
        return self.pipelines.get((tenant, name), load)

    def _pipeline_version(self, batch: Batch) -> int:
        try:
            return self.pipeline(batch.tenant, batch.pipeline).version
        except NotFound:
            return 0


def commit_intervals(definition: PipelineDefinition) -> dict[str, float]:
    """Static tables whose sink sets a commit interval (the shortest wins)."""
    intervals: dict[str, float] = {}
    for sink in definition.sinks:
        if sink.commit_interval and not sink.dynamic:
            intervals[sink.table] = min(sink.commit_interval, intervals.get(sink.table, sink.commit_interval))
    return intervals
