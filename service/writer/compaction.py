"""The writer's side of compaction: run a leader's request on Spark and hand the merged files back.

Writers hold the Spark sessions and already hand files to the committer, so the rewrite runs
here: the leader plans from metadata and commits, a writer does the heavy part between its
batches (one request per round, so ingest waits at most one bounded job). The result is a rewrite
entry on the table's commit stream, committed in stream order as a `replace` snapshot, only if
every file it replaces is still live.
"""

from __future__ import annotations

import logging
import time

from service.core import keys, metrics
from service.iceberg.catalog import load_table
from service.iceberg.files import catalog_io, delete_files, list_data_files, spark_filesystem
from service.protocol.commit_entry import REPLACE, FilesWritten
from service.protocol.compaction import CompactionRequest
from service.protocol.upkeep import record_upkeep
from service.writer.requests import LeaderRequests
from spark_jobs.compact_job import rewrite_files
from spark_jobs.pipeline_job import new_directory
from spark_jobs.session import spark_session

log = logging.getLogger(__name__)


class Compactor(LeaderRequests):
    queue = keys.COMPACTIONS

    def run(self, raw: bytes) -> None:
        request = CompactionRequest.from_json(raw)
        started = time.perf_counter()
        directory = None
        io = catalog_io(self.catalog)
        try:
            table = load_table(self.catalog, request.tenant, request.table)
            if table is None:
                self.client.delete(keys.compacting_key(request.tenant, request.table))
                return
            schema = table.schema()
            required = frozenset(field.name for field in schema.fields if field.required)
            directory = new_directory(table.location(), "compact")
            spark = spark_session(self.spark_remote)
            for index, (paths, outputs) in enumerate(request.groups):
                rewrite_files(spark, paths, schema.as_arrow(), required, f"{directory}/part-{index}", outputs, spark_filesystem(directory, io))
            written = FilesWritten(request.tenant, request.table, list_data_files(directory, io), {},
                                   removes=request.files, operation=REPLACE, request=request.request)
            fields = written.to_fields(self.name)
            self.client.xadd(keys.commit_stream_key(request.tenant, request.table), dict(zip(fields[::2], fields[1::2])))
            self.client.sadd(keys.TABLES, keys.member(request.tenant, request.table))
        except Exception as exc:  # noqa: BLE001 - compaction is optional work; the leader plans it again
            log.warning("writer: compaction of %s.%s failed: %s", request.tenant, request.table, exc)
            if directory is not None:
                delete_files(list_data_files(directory, io), io)
            metrics.COMPACTIONS_DROPPED.labels(request.tenant, request.table).inc()
            record_upkeep(self.client, request.tenant, request.table, "compact", {
                "outcome": "failed", "error": str(exc)[:500], "request": request.request,
            })
            self.client.delete(keys.compacting_key(request.tenant, request.table))
            return
        log.info("writer %s rewrote %d files of %s.%s into %d in %.1f s", self.name, len(request.files), request.tenant,
                 request.table, len(written.files), time.perf_counter() - started)
