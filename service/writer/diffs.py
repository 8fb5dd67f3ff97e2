"""The writer's side of the change feed: a snapshot's changes computed on Spark for a feed reader
that found them too large to compute itself (service/protocol/feeds.py)."""

from __future__ import annotations

import logging
import time

import pyarrow.parquet as pq

from service.core import keys
from service.iceberg.catalog import load_table
from service.iceberg.changelog import Changelog, snapshot_files
from service.iceberg.files import catalog_io, delete_files, list_data_files, locate, spark_filesystem
from service.protocol import feeds
from service.protocol.feeds import DiffRequest, DiffResult
from service.writer.requests import LeaderRequests
from service.writer.spark_errors import is_spark_outage
from spark_jobs.diff_job import diff_snapshot
from spark_jobs.session import spark_session

log = logging.getLogger(__name__)

OUTAGE_BACKOFF_S = 2.0


class FeedDiffer(LeaderRequests):
    queue = keys.FEED_DIFFS

    def run(self, raw: bytes) -> None:
        request = DiffRequest.from_json(raw)
        key = keys.feed_diff_key(request.tenant, request.table, request.snapshot_id, request.schema_id)
        started = time.perf_counter()
        directory = None
        io = catalog_io(self.catalog)
        try:
            table = load_table(self.catalog, request.tenant, request.table)
            snapshot = table.metadata.snapshot_by_id(request.snapshot_id) if table is not None else None
            if snapshot is None or table.schema().schema_id != request.schema_id:
                raise LookupError(f"table {request.table!r} no longer has snapshot {request.snapshot_id} in schema {request.schema_id}")
            files = snapshot_files(table, snapshot)
            changelog = Changelog(table)
            directory = f"{table.location()}/data/_calve_feed/{request.snapshot_id}-{request.schema_id}-{request.request}"
            diff_snapshot(spark_session(self.spark_remote), [f.file_path for f in files.removed], [f.file_path for f in files.added],
                          changelog.schema.as_arrow(), changelog.identifier, directory, spark_filesystem(directory, io))
            paths = list_data_files(directory, io)
            rows = 0
            for path in paths:
                store, location = locate(path, io)
                with store.open_input_file(location) as stream:
                    rows += pq.ParquetFile(stream).metadata.num_rows
            result = DiffResult(request.request, paths, rows)
        except Exception as exc:  # noqa: BLE001 - the reader computes the changes itself then
            if directory is not None:
                delete_files(list_data_files(directory, io), io)
            if is_spark_outage(exc):
                log.warning("writer: Spark is unavailable (%s); the feed diff of %s.%s waits for it", exc, request.tenant, request.table)
                self.client.rpush(self.queue, raw)
                time.sleep(OUTAGE_BACKOFF_S)
                return
            log.warning("writer: diffing snapshot %s of %s.%s failed: %s", request.snapshot_id, request.tenant, request.table, exc)
            result = DiffResult(request.request, error=f"{exc.__class__.__name__}: {exc}"[:1000])
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(key, feeds.RESULT, result.to_json())
        pipe.expire(key, feeds.FEED_DIFF_TTL_S)
        pipe.execute()
        log.info("writer %s diffed snapshot %s of %s.%s in %.2f s: %d change rows", self.name, request.snapshot_id,
                 request.tenant, request.table, time.perf_counter() - started, result.rows)
