"""The writer's side of row changes: apply a leader's request on Spark (spark_jobs/changes_job.py).

A changes entry's events are applied when the table's leader asks, against the snapshot it names:
the writer picks the candidate files from that snapshot's metadata (by the identifier columns'
statistics: service/iceberg/candidates.py), applies them in the table's write mode (merge-on-read
runs of modest size in one Spark task, spark_jobs/row_delta_job.py; the rest as Spark jobs,
spark_jobs/changes_job.py), and answers in the table's applying_key hash. The leader commits the answer, or asks again if the table moved. A
failure is answered as such (the leader counts it, and parks an entry that fails alone); an
outage of Spark is not the changes' fault: the request goes back on the queue unanswered.
"""

from __future__ import annotations

import logging
import time

import pyarrow as pa
import pyarrow.parquet as pq

from service.core import keys, metrics
from service.iceberg.candidates import candidate_files
from service.iceberg.catalog import load_table
from service.iceberg.files import delete_files, list_data_files, locate, spark_filesystem
from service.iceberg.rewrites import merge_on_read
from service.protocol import changes
from service.protocol.changes import ApplyRequest, ApplyResult
from service.protocol.commit_entry import Operation
from service.writer.requests import LeaderRequests, Scratch, error_text
from spark_jobs.changes_job import apply_changes
from spark_jobs.row_delta_job import apply_in_one_task, fits
from spark_jobs.session import spark_session, tasks_at_most
from spark_jobs.targets import ChangeSpec, Target, new_directory

log = logging.getLogger(__name__)


def changes_fields(spec: ChangeSpec | None) -> dict:
    """The CommitEntry fields of a table whose events change rows (none for an append)."""
    return {} if spec is None else {"operation": Operation.CHANGES, "keys": list(spec.keys), "upsert": spec.upsert}


class ChangeApplier(LeaderRequests):
    queue = keys.APPLIES

    def decode(self, raw: bytes) -> ApplyRequest:
        return ApplyRequest.from_json(raw)

    def describe(self, request: ApplyRequest) -> str:
        return f"the changes of {request.tenant}.{request.table}"

    def run(self, request: ApplyRequest, scratch: Scratch) -> tuple[ApplyResult, float, dict[str, float]]:
        """(the answer, seconds taken, seconds by phase where the way measures them)."""
        started = time.perf_counter()
        table = load_table(self.catalog, request.tenant, request.table)
        if table is None:
            raise LookupError(f"table {request.table!r} no longer exists")
        schema = table.schema()
        directory = scratch.directory = new_directory(table.location())
        target = Target(
            name=request.table, schema=schema.as_arrow(), required=frozenset(f.name for f in schema.fields if f.required),
            partition=[(schema.find_column_name(f.source_id), str(f.transform)) for f in table.spec().fields], directory=directory,
            filesystem=spark_filesystem(directory, self.io),
        )
        spark = spark_session(self.spark_remote)
        entries = [files for _entry_id, files in request.entries]
        changed = self._changed_keys(entries, request.keys)
        candidates = self._candidates(table, request, changed)
        planned = time.perf_counter()
        applied, by_deletes = None, merge_on_read(table)
        if by_deletes and fits(changed.num_rows, len(candidates), target):
            try:
                applied = apply_in_one_task(spark, entries, candidates, target, request.keys, request.upsert)
            except Exception as exc:  # noqa: BLE001 - the Spark jobs below apply them (an outage fails those too)
                log.warning("writer: the one-task way could not apply the changes of %s.%s (%s); running the Spark jobs",
                            request.tenant, request.table, error_text(exc))
                delete_files(list_data_files(directory, self.io) + list_data_files(f"{directory}-deletes", self.io), self.io)
        if applied is None:
            with tasks_at_most(spark, self.tasks):  # too large for one task: still not every core
                applied = apply_changes(spark, entries, candidates, target, request.keys, request.upsert, by_deletes)
        result = ApplyResult(request.request, request.base_snapshot, applied.removes, list_data_files(directory, self.io), applied.counts,
                             deletes=[list(written) for written in applied.deletes])
        return result, time.perf_counter() - started, {"plan": round(planned - started, 3), **applied.seconds}

    def finish(self, request: ApplyRequest, outcome: tuple[ApplyResult, float, dict[str, float]]) -> None:
        result, seconds, phases = outcome
        self._answer(request, result)
        metrics.SPARK_JOB_SECONDS.labels(request.tenant, "_changes").observe(seconds)
        log.info("writer %s applied %d change entries to %s.%s in %.2f s (%s): %d files replaced by %d", self.name,
                 len(request.entries), request.tenant, request.table, seconds, phases, len(result.removes), len(result.adds) + len(result.deletes))

    def failed(self, request: ApplyRequest, exc: Exception) -> None:
        """The leader sees the error and counts it as a failed commit."""
        log.warning("writer: applying changes to %s.%s failed: %s", request.tenant, request.table, exc)
        self._answer(request, ApplyResult(request.request, request.base_snapshot, error=error_text(exc)))

    def _changed_keys(self, entries: list[list[str]], keys: list[str]) -> pa.Table:
        """The identifier columns of every change event (read from the change files' own
        columns: small, and planning needs them before any Spark job)."""
        tables = []
        for path in (path for paths in entries for path in paths):
            store, where = locate(path, self.io)
            tables.append(pq.read_table(where, columns=keys, filesystem=store))
        return pa.concat_tables(tables, promote_options="permissive")

    def _candidates(self, table, request: ApplyRequest, changed: pa.Table) -> list[tuple[str, list[str]]]:  # noqa: ANN001
        """Data files of the base snapshot that may hold a changed key, each with its position
        delete files (service/iceberg/candidates.py), but for those committed ahead of these
        changes (appends queued after them: they come after them)."""
        if request.base_snapshot is None:
            return []
        unseen = set(request.unseen)
        return [candidate for candidate in candidate_files(table, request.base_snapshot, request.keys, changed) if candidate[0] not in unseen]

    def _answer(self, request: ApplyRequest, result: ApplyResult) -> None:
        key = keys.applying_key(request.tenant, request.table)
        asked = self.client.hget(key, changes.REQUEST)
        if asked is None or ApplyRequest.from_json(asked).request != request.request:
            # The leader gave up on this request (it expired, or the table moved): never committed.
            delete_files(result.written, self.io)
            return
        self.client.hset(key, changes.RESULT, result.to_json())
