"""Upkeep of a table, by its leader between its commits: expiry, manifest merging, orphan
removal, and compactions planned here and run by a writer on Spark (their rewrite comes back on
the commit stream). Each run is counted, timed and recorded as the task's last UpkeepRun."""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import Callable

import orjson
import redis
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from sqlmodel import Session

from service.committer.leases import TableLease
from service.core import keys, metrics
from service.core.config import Settings
from service.core.db import get_engine
from service.feeds.consumers import protected_snapshots
from service.iceberg.catalog import load_table
from service.iceberg.compaction import CompactionPolicy, compactable, plan_compaction
from service.iceberg.upkeep import ExpiryPolicy, expire_snapshots, merge_manifests, remove_orphans
from service.protocol import commit_entry
from service.protocol.compaction import CompactionRequest
from service.protocol.stream_ids import text
from service.protocol.upkeep import UpkeepOutcome, UpkeepRun, UpkeepTask

log = logging.getLogger(__name__)

Work = Callable[[str, str, Table], "UpkeepRun | None"]


def record_compaction(client: redis.Redis, tenant: str, table_name: str, run: UpkeepRun) -> None:
    run.record(client, tenant, table_name, UpkeepTask.COMPACT)


def compaction_settled(client: redis.Redis, tenant: str, table_name: str, request: str | None) -> None:
    """The table's compaction `request` is over (committed or dropped): another may be planned."""
    marker = keys.compacting_key(tenant, table_name)
    if request and text(client.get(marker) or b"") == request:
        client.delete(marker)


class TableUpkeep:
    def __init__(self, settings: Settings, client: redis.Redis, catalog: Catalog) -> None:
        self.settings = settings
        self.client = client
        self.catalog = catalog
        self.expiry = ExpiryPolicy(settings.snapshot_max_age_s, settings.snapshot_max_count, settings.snapshot_min_count)
        self.compaction = CompactionPolicy.from_settings(settings)

    def maintain(self, tenant: str, table_name: str, lease: TableLease) -> None:
        """Run the upkeep tasks asked for by hand (POST /v1/tables/{name}/maintenance) now; each
        task's record carries the request's id, which the api waits for."""
        key = keys.maintenance_key(tenant, table_name)
        # Off the registry first, then the tasks taken: a request arriving in between puts the
        # table back on the registry, and the next round finds its tasks (or nothing: harmless).
        # Two steps, because the registry and the table's keys are in different cluster slots.
        self.client.srem(keys.MAINTENANCE, keys.member(tenant, table_name))
        pipe = self.client.pipeline(transaction=True)
        pipe.hgetall(key)
        pipe.delete(key)
        asked = {text(task): text(request) for task, request in pipe.execute()[0].items()}
        if UpkeepTask.COMPACT in asked and self.client.exists(keys.compacting_key(tenant, table_name)):
            # A compaction is running (the scheduled upkeep's, or one a change run asked for): this
            # one is asked for once it is over, at a later tick; the api waits for its record.
            self.client.hset(key, UpkeepTask.COMPACT, asked.pop(UpkeepTask.COMPACT))
            self.client.sadd(keys.MAINTENANCE, keys.member(tenant, table_name))
        work: dict[UpkeepTask, Work] = {
            UpkeepTask.EXPIRE: self._expire, UpkeepTask.ORPHANS: self._orphans, UpkeepTask.MANIFESTS: self._merge_manifests,
            UpkeepTask.COMPACT: lambda t, n, table: self._request_compaction(t, n, table, asked[UpkeepTask.COMPACT]),
        }
        # In this order: compaction plans on merged manifests.
        for task in (UpkeepTask.MANIFESTS, UpkeepTask.EXPIRE, UpkeepTask.COMPACT, UpkeepTask.ORPHANS):
            if task in asked:
                self._run(task, tenant, table_name, lease, work[task], asked[task])

    def run_scheduled(self, tenant: str, table_name: str, lease: TableLease) -> None:
        """Expire what the table's policy lets go, and ask for a compaction where small files
        piled up; only its leader does, between its commits."""
        self._run(UpkeepTask.EXPIRE, tenant, table_name, lease, self._expire)
        self._run(UpkeepTask.COMPACT, tenant, table_name, lease, self._request_compaction)

    def compact_after_run(self, tenant: str, table_name: str, lease: TableLease) -> None:
        """After a run of row changes commits: ask for a compaction where small files piled up,
        as the scheduled upkeep does, without waiting for it. Each run adds a file to every
        partition it touches, and the next run looks in, and writes a delete file beside, each of
        them: merged by size tier as they pile up, they stay few (compaction.py)."""
        if not self.client.exists(keys.compacting_key(tenant, table_name)):
            self._run(UpkeepTask.COMPACT, tenant, table_name, lease, self._request_compaction)

    def remove_orphans(self, tenant: str, table_name: str, lease: TableLease) -> None:
        """Delete what nothing references: not the table's snapshots, and not the entries waiting
        on its commit stream or parked on its dead commit stream."""
        self._run(UpkeepTask.ORPHANS, tenant, table_name, lease, self._orphans)

    def _expire(self, tenant: str, table_name: str, table: Table) -> UpkeepRun:
        with Session(get_engine(self.settings.resolved_database_url())) as session:
            held = protected_snapshots(session, tenant, table_name, table, self.settings.consumer_max_lag_s)
        result = expire_snapshots(table, self.expiry, held)
        metrics.SNAPSHOTS_EXPIRED.labels(tenant, table_name).inc(len(result.expired))
        return UpkeepRun(UpkeepOutcome.OK, facts={"snapshots_expired": len(result.expired), "files_deleted": result.files_deleted})

    def _request_compaction(self, tenant: str, table_name: str, table: Table, asked: str | None = None) -> UpkeepRun | None:
        """Plan a compaction and hand it to the writers (who run it on Spark); its rewrite comes
        back on the commit stream. One at a time per table. Asked for by hand (`asked`: the
        request's id), any partition with two small files qualifies, and the outcome is recorded
        even when there is nothing to do; otherwise None means nothing to record."""
        if self.client.exists(keys.compacting_key(tenant, table_name)):
            return UpkeepRun(UpkeepOutcome.BUSY, detail="a compaction of this table is already running") if asked else None
        if not asked and self.client.hexists(keys.maintenance_key(tenant, table_name), UpkeepTask.COMPACT):
            return None  # one asked for by hand waits for the running one to end: it goes next
        policy = self.compaction.for_table(table)
        if asked:
            policy = policy.everything()
        groups = (plan_compaction(compactable(table), policy, table.spec().spec_id, now_ms=int(time.time() * 1000))
                  if table.current_snapshot() else [])
        if not groups:
            return UpkeepRun(UpkeepOutcome.OK, detail="no partition holds two small files or a file with deleted rows",
                             facts={"requested_files": 0}) if asked else None
        request = CompactionRequest(tenant, table_name, asked or uuid.uuid4().hex, [
            ([file.file_path for file in group.files], group.outputs) for group in groups
        ], {path: deletes for group in groups for path, deletes in group.deletes.items()})
        if not self.client.set(keys.compacting_key(tenant, table_name), request.request, nx=True, ex=int(self.settings.compact_timeout_s)):
            return None
        self.client.rpush(keys.COMPACTIONS, request.to_json())
        log.info("upkeep: asked for a compaction of %d files of %s.%s (%d partitions)", len(request.files), tenant, table_name, len(groups))
        return UpkeepRun(UpkeepOutcome.REQUESTED, request=request.request, facts={
            "requested_files": len(request.files), "partitions": len(groups), "delete_files_to_fold": sum(map(len, request.deletes.values())),
        })

    def _merge_manifests(self, _tenant: str, _table_name: str, table: Table) -> UpkeepRun:
        return UpkeepRun(UpkeepOutcome.OK, facts={"manifests_merged": merge_manifests(table)})

    def _orphans(self, tenant: str, table_name: str, table: Table) -> UpkeepRun:
        waiting: set[str] = set()
        for stream in (keys.commit_stream_key(tenant, table_name), keys.dead_commit_stream_key(tenant, table_name)):
            for _entry_id, fields in self.client.xrange(stream):
                waiting.update(orjson.loads(fields[commit_entry.FILES.encode()]))
        return UpkeepRun(UpkeepOutcome.OK, facts={"files_deleted": remove_orphans(table, self.settings.orphan_min_age_s, waiting)})

    def _run(self, task: UpkeepTask, tenant: str, table_name: str, lease: TableLease, work: Work, asked: str | None = None) -> None:
        """One upkeep task on a table this committer leads, counted, timed and recorded for the
        table's health; a failure is logged and retried next interval, never stops the commits."""
        started = time.perf_counter()
        try:
            table = load_table(self.catalog, tenant, table_name)
            if table is None or not lease.held():
                return
            run = work(tenant, table_name, table)
        except Exception as exc:  # noqa: BLE001 - upkeep failing must not stop commits; next interval retries
            metrics.UPKEEP_RUNS.labels(task.value, "failed").inc()
            log.warning("upkeep %s of %s.%s failed (%s); will retry", task, tenant, table_name, exc)
            UpkeepRun.failed(exc, asked).record(self.client, tenant, table_name, task)
            return
        seconds = time.perf_counter() - started
        metrics.UPKEEP_RUNS.labels(task.value, "ok").inc()
        metrics.UPKEEP_SECONDS.labels(task.value).observe(seconds)
        if run is None:
            return
        metrics.UPKEEP_FILES_DELETED.labels(tenant, table_name).inc(run.facts.get("files_deleted", 0))
        run = dataclasses.replace(run, request=run.request or asked, seconds=round(seconds, 3))
        if any(run.facts.values()) or asked:
            log.info("upkeep %s of %s.%s: %s", task, tenant, table_name, run.to_dict())
        run.record(self.client, tenant, table_name, task)
