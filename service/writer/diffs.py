"""The writer's side of the change feed: a snapshot's changes computed on Spark for a feed reader
that found them too large to compute itself (service/protocol/feeds.py)."""

from __future__ import annotations

import logging
import time

import pyarrow.parquet as pq

from service.core import keys
from service.iceberg.catalog import load_table
from service.iceberg.changelog import Changelog, snapshot_files
from service.iceberg.files import list_data_files, locate, spark_filesystem
from service.protocol import feeds
from service.protocol.feeds import DiffRequest, DiffResult
from service.writer.requests import LeaderRequests, Scratch, error_text
from spark_jobs.diff_job import diff_snapshot
from spark_jobs.session import spark_session, tasks_at_most

log = logging.getLogger(__name__)


class FeedDiffer(LeaderRequests):
    queue = keys.FEED_DIFFS

    def decode(self, raw: bytes) -> DiffRequest:
        return DiffRequest.from_json(raw)

    def describe(self, request: DiffRequest) -> str:
        return f"the feed diff of {request.tenant}.{request.table}"

    def run(self, request: DiffRequest, scratch: Scratch) -> tuple[DiffResult, float]:
        started = time.perf_counter()
        table = load_table(self.catalog, request.tenant, request.table)
        snapshot = table.metadata.snapshot_by_id(request.snapshot_id) if table is not None else None
        if snapshot is None or table.schema().schema_id != request.schema_id:
            raise LookupError(f"table {request.table!r} no longer has snapshot {request.snapshot_id} in schema {request.schema_id}")
        files = snapshot_files(table, snapshot)
        if not files.whole_files:
            raise ValueError(f"snapshot {request.snapshot_id} has position deletes to apply, which the Spark diff does not read")
        changelog = Changelog(table)
        directory = scratch.directory = f"{table.location()}/data/_calve_feed/{request.snapshot_id}-{request.schema_id}-{request.request}"
        spark = spark_session(self.spark_remote)
        with tasks_at_most(spark, self.tasks):
            diff_snapshot(spark, [p.file.file_path for p in files.removed], [p.file.file_path for p in files.added],
                          changelog.schema.as_arrow(), changelog.identifier, directory, spark_filesystem(directory, self.io))
        paths = list_data_files(directory, self.io)
        rows = 0
        for path in paths:
            store, location = locate(path, self.io)
            with store.open_input_file(location) as stream:
                rows += pq.ParquetFile(stream).metadata.num_rows
        return DiffResult(request.request, paths, rows), time.perf_counter() - started

    def finish(self, request: DiffRequest, outcome: tuple[DiffResult, float]) -> None:
        result, seconds = outcome
        self._answer(request, result)
        log.info("writer %s diffed snapshot %s of %s.%s in %.2f s: %d change rows", self.name, request.snapshot_id,
                 request.tenant, request.table, seconds, result.rows)

    def failed(self, request: DiffRequest, exc: Exception) -> None:
        """The reader computes the changes itself then."""
        log.warning("writer: diffing snapshot %s of %s.%s failed: %s", request.snapshot_id, request.tenant, request.table, exc)
        self._answer(request, DiffResult(request.request, error=error_text(exc)))

    def _answer(self, request: DiffRequest, result: DiffResult) -> None:
        key = keys.feed_diff_key(request.tenant, request.table, request.snapshot_id, request.schema_id)
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(key, feeds.RESULT, result.to_json())
        pipe.expire(key, feeds.FEED_DIFF_TTL_S)
        pipe.execute()
