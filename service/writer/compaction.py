"""The writer's side of compaction: run a leader's request on Spark and hand the merged files back.

Writers hold the Spark sessions and already hand files to the committer, so the rewrite runs
here: the leader plans from metadata and commits, a writer does the heavy part on a thread of its
own beside its batches (service/writer/loop.py), in a Spark session of its own (its jobs run at
most compact_tasks tasks at once, a setting of their session). The result is a rewrite
entry on the table's commit stream, committed in stream order as a `replace` snapshot, only if
every file it replaces is still live.
"""

from __future__ import annotations

import logging
import time

from service.core import keys, metrics
from service.iceberg.catalog import load_table
from service.iceberg.files import list_data_files, spark_filesystem
from service.protocol.commit_entry import CommitEntry, Operation
from service.protocol.compaction import CompactionRequest
from service.protocol.upkeep import UpkeepRun, UpkeepTask
from service.writer.requests import LeaderRequests, Scratch
from spark_jobs.compact_job import rewrite_files
from spark_jobs.session import UPKEEP, reset_session, spark_session
from spark_jobs.spark_errors import is_spark_outage
from spark_jobs.targets import new_directory

log = logging.getLogger(__name__)


class Compactor(LeaderRequests):
    queue = keys.COMPACTIONS
    waits_out_outages = False  # optional work: the leader plans it again

    def decode(self, raw: bytes) -> CompactionRequest:
        return CompactionRequest.from_json(raw)

    def describe(self, request: CompactionRequest) -> str:
        return f"the compaction of {request.tenant}.{request.table}"

    def run(self, request: CompactionRequest, scratch: Scratch) -> None:
        started = time.perf_counter()
        table = load_table(self.catalog, request.tenant, request.table)
        if table is None:
            self.client.delete(keys.compacting_key(request.tenant, request.table))
            return
        schema = table.schema()
        required = frozenset(field.name for field in schema.fields if field.required)
        directory = scratch.directory = new_directory(table.location(), "compact")
        spark = spark_session(self.spark_remote, UPKEEP)
        for index, (paths, outputs) in enumerate(request.groups):
            rewrite_files(spark, paths, schema.as_arrow(), required, f"{directory}/part-{index}", outputs, spark_filesystem(directory, self.io),
                          deletes={path: request.deletes[path] for path in paths if path in request.deletes}, tasks=self.tasks)
        written = CommitEntry(request.tenant, request.table, list_data_files(directory, self.io), {},
                              operation=Operation.REPLACE, removes=request.files, request=request.request, folded=request.deletes)
        self.client.xadd(keys.commit_stream_key(request.tenant, request.table), written.to_mapping(self.name))
        self.client.sadd(keys.TABLES, keys.member(request.tenant, request.table))
        log.info("writer %s rewrote %d files of %s.%s into %d (%d delete files folded in) in %.1f s", self.name, len(request.files),
                 request.tenant, request.table, len(written.files), sum(map(len, request.deletes.values())), time.perf_counter() - started)

    def failed(self, request: CompactionRequest, exc: Exception) -> None:
        log.warning("writer: compaction of %s.%s failed: %s", request.tenant, request.table, exc)
        if is_spark_outage(exc):  # a server back from an outage knows nothing of the session
            reset_session(self.spark_remote, UPKEEP)
        metrics.COMPACTIONS_DROPPED.labels(request.tenant, request.table).inc()
        UpkeepRun.failed(exc, request.request).record(self.client, request.tenant, request.table, UpkeepTask.COMPACT)
        self.client.delete(keys.compacting_key(request.tenant, request.table))
