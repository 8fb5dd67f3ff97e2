"""The committer: one leader per table turns written files into Iceberg snapshots.

Per table and commit interval: read the table's watermark (the last commit-stream entry it
holds), acknowledge entries at or below it that a previous leader committed but did not get to
announce, then fast-append the files of every entry after it in one snapshot whose summary
carries the new watermark, a commit id and this leader's fence. A compare-and-swap conflict
reloads the table and filters against the new watermark before trying again, so retried or
overlapping commits never add a file twice.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable

import orjson
import redis
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.expressions import In
from pyiceberg.table import Table
from tenacity import (
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
)

from service.committer.leases import TableLease
from service.committer.receipts import ReceiptPublisher
from service.committer.state import CommitPlan, CommitSchedule, UpkeepSchedule
from service.core import faults, keys, metrics
from service.core.config import Settings
from service.core.exceptions import LeadershipLost
from service.core.faults import fault_point
from service.core.identity import consumer_name
from service.iceberg.appends import append_files
from service.iceberg.catalog import (
    CATALOG_UNAVAILABLE,
    ensure_commit_properties,
    load_table,
)
from service.iceberg.upkeep import ExpiryPolicy, expire_snapshots, remove_orphans
from service.iceberg.watermark import calve_snapshots, watermark
from service.protocol import commit_entry
from service.protocol.commit_entry import PendingFiles
from service.protocol.stream_ids import parse_id, text

log = logging.getLogger(__name__)

TICK_S = 0.1
ISOLATE_AT_MOST = 20  # entries committed one at a time per isolation of a stuck table
# Commit failures that say nothing about the entries: the catalog unreachable or busy, conflicts.
TRANSIENT: tuple[type[Exception], ...] = (*CATALOG_UNAVAILABLE, CommitFailedException)


def next_id(entry_id: str) -> str:
    millis, seq = parse_id(entry_id)
    return f"{millis}-{seq + 1}"


class Committer:
    def __init__(self, settings: Settings, client: redis.Redis, catalog: Catalog, name: str | None = None) -> None:
        self.settings = settings
        self.client = client
        self.catalog = catalog
        self.name = name or consumer_name()
        self.schedule = CommitSchedule(settings.commit_interval_s)
        self.upkeep_schedule = UpkeepSchedule(settings.upkeep_interval_s)
        self.orphan_schedule = UpkeepSchedule(settings.orphan_interval_s)
        self.expiry = ExpiryPolicy(settings.snapshot_max_age_s, settings.snapshot_max_count, settings.snapshot_min_count)
        self.leases: dict[str, TableLease] = {}
        self.publisher = ReceiptPublisher(client)

    def run(self, stop: threading.Event) -> None:
        log.info("committer %s started", self.name)
        while not stop.is_set():
            try:
                self.tick()
            except redis.RedisError as exc:
                log.warning("committer: Redis unavailable (%s); retrying", exc)
                stop.wait(1.0)
                continue
            stop.wait(TICK_S)
        self.drain()
        self.release_all()
        log.info("committer %s stopped", self.name)

    def drain(self) -> None:
        """On shutdown: commit what is pending for the tables this committer leads, interval or not."""
        for member, lease in list(self.leases.items()):
            tenant, table = keys.split_member(member)
            try:
                if lease.renew() and self.commit_table(tenant, table, lease):
                    log.info("committer %s committed %s while shutting down", self.name, member)
            except Exception:  # noqa: BLE001 - what is not committed stays on the stream for the next leader
                log.exception("committer: final commit of %s failed; the next leader will commit it", member)

    def tick(self) -> None:
        for member in sorted(text(m) for m in self.client.smembers(keys.TABLES)):
            lease = self.lease(member)
            if lease is None:
                continue
            now = time.monotonic()
            tenant, table = keys.split_member(member)
            if self.upkeep_schedule.is_upkeep_due(member, now):
                self.upkeep(tenant, table, lease)
                self.upkeep_schedule.record_upkeep(member, now)
            if self.orphan_schedule.is_upkeep_due(member, now):
                self.remove_orphans(tenant, table, lease)
                self.orphan_schedule.record_upkeep(member, now)
            if not self.schedule.is_commit_due(member, now):
                continue
            try:
                if self.commit_table(tenant, table, lease, member):
                    self.schedule.record_commit(member, now)
                self.schedule.record_success(member)
            except LeadershipLost:
                log.warning("committer %s lost the lease of %s before committing", self.name, member)
                self.leases.pop(member, None)
            except TRANSIENT as exc:  # the catalog is away or busy: nothing is wrong with the entries
                metrics.COMMIT_FAILURES.labels(tenant, table, "unavailable").inc()
                log.warning("committer: commit of %s failed (%s); will retry", member, exc)
                self.schedule.record_commit(member, now)  # back off one interval
            except Exception:  # noqa: BLE001 - one table's failure must not stop the others
                metrics.COMMIT_FAILURES.labels(tenant, table, "error").inc()
                log.exception("committer: commit of %s failed; will retry", member)
                self.schedule.record_commit(member, now)  # back off one interval
                if self.schedule.record_failure(member) >= self.settings.commit_max_failures:
                    self.schedule.record_success(member)
                    self.isolate_stuck(tenant, table, lease)

    def isolate_stuck(self, tenant: str, table_name: str, lease: TableLease) -> None:
        """The table's commits kept failing for a cause that does not pass: commit its pending
        entries one at a time, and park each that fails alone on the dead commit stream (its
        receipts failed with the reason), so the entries after it commit again."""
        planned = self.plan(tenant, table_name)
        if planned is None:
            return
        table, plan = planned
        stream = keys.commit_stream_key(tenant, table_name)
        # Bounded, as this runs in the loop every table shares: after the first entry parked (or
        # ISOLATE_AT_MOST committed alone) the table goes back to committing in batches, and a
        # second bad entry is found the same way later.
        for entry in plan.entries[:ISOLATE_AT_MOST]:
            try:
                self.apply(tenant, table_name, table, CommitPlan([entry]), lease)
            except (LeadershipLost, *TRANSIENT):
                raise
            except Exception as exc:  # noqa: BLE001 - this entry's own failure: park it
                reason = f"commit failed alone after {self.settings.commit_max_failures} failed commits: {exc}"[:1000]
                raw = self.client.xrange(stream, min=entry.entry_id, max=entry.entry_id)
                if raw:
                    failed = self.publisher.dead_letter(tenant, table_name, entry.entry_id, raw[0][1], reason)
                    metrics.DEAD_COMMIT_ENTRIES.labels(tenant, table_name).inc()
                    log.error("committer: parked entry %s of %s.%s (%d receipts failed): %s", entry.entry_id, tenant, table_name, len(failed), reason)
                return
            table = self.catalog.load_table((tenant, table_name))

    def upkeep(self, tenant: str, table_name: str, lease: TableLease) -> None:
        """Expire what the table's policy lets go; only its leader does, between its commits."""
        self._run_upkeep("expire", tenant, table_name, lease, self._expire)

    def remove_orphans(self, tenant: str, table_name: str, lease: TableLease) -> None:
        """Delete what nothing references: not the table's snapshots, and not the entries waiting
        on its commit stream or parked on its dead commit stream."""
        self._run_upkeep("orphans", tenant, table_name, lease, self._orphans)

    def _expire(self, tenant: str, table_name: str, table: Table) -> dict[str, int]:
        result = expire_snapshots(table, self.expiry)
        metrics.SNAPSHOTS_EXPIRED.labels(tenant, table_name).inc(len(result.expired))
        return {"snapshots_expired": len(result.expired), "files_deleted": result.files_deleted}

    def _orphans(self, tenant: str, table_name: str, table: Table) -> dict[str, int]:
        waiting: set[str] = set()
        for stream in (keys.commit_stream_key(tenant, table_name), keys.dead_commit_stream_key(tenant, table_name)):
            for _entry_id, fields in self.client.xrange(stream):
                waiting.update(orjson.loads(fields[commit_entry.FILES.encode()]))
        return {"files_deleted": remove_orphans(table, self.settings.orphan_min_age_s, waiting)}

    def _run_upkeep(
        self, task: str, tenant: str, table_name: str, lease: TableLease, work: Callable[[str, str, Table], dict[str, int]],
    ) -> None:
        """One upkeep task on a table this committer leads, counted, timed and recorded for the
        table's health; a failure is logged and retried next interval, never stops the commits."""
        started = time.perf_counter()
        try:
            table = load_table(self.catalog, tenant, table_name)
            if table is None or not lease.held():
                return
            counts = work(tenant, table_name, table)
        except Exception as exc:  # noqa: BLE001 - upkeep failing must not stop commits; next interval retries
            metrics.UPKEEP_RUNS.labels(task, "failed").inc()
            log.warning("upkeep %s of %s.%s failed (%s); will retry", task, tenant, table_name, exc)
            self._record_upkeep(tenant, table_name, task, {"outcome": "failed", "error": str(exc)[:500]})
            return
        seconds = time.perf_counter() - started
        metrics.UPKEEP_RUNS.labels(task, "ok").inc()
        metrics.UPKEEP_SECONDS.labels(task).observe(seconds)
        metrics.UPKEEP_FILES_DELETED.labels(tenant, table_name).inc(counts.get("files_deleted", 0))
        if any(counts.values()):
            log.info("upkeep %s of %s.%s: %s", task, tenant, table_name, counts)
        self._record_upkeep(tenant, table_name, task, {"outcome": "ok", **counts, "seconds": round(seconds, 3)})

    def _record_upkeep(self, tenant: str, table_name: str, task: str, outcome: dict) -> None:
        # The last run of each task, for GET /v1/tables/{name} (health).
        self.client.hset(keys.upkeep_key(tenant, table_name), task, orjson.dumps(outcome | {"at_ms": int(time.time() * 1000)}))

    def lease(self, member: str) -> TableLease | None:
        """This committer's lease on the table, renewed, or None when another committer leads."""
        lease = self.leases.get(member)
        if lease is not None:
            if lease.renew():
                return lease
            log.warning("committer %s lost the lease of %s", self.name, member)
            del self.leases[member]
        tenant, table = keys.split_member(member)
        lease = TableLease(self.client, tenant, table, self.name, int(self.settings.lease_s * 1000))
        if not lease.acquire():
            return None
        log.info("committer %s leads %s (fence %d)", self.name, member, lease.fence)
        self.leases[member] = lease
        return lease

    def release_all(self) -> None:
        for lease in self.leases.values():
            try:
                lease.release()
            except redis.RedisError:
                pass
        self.leases.clear()

    # -- one table --------------------------------------------------------------------------

    def commit_table(self, tenant: str, table_name: str, lease: TableLease, member: str | None = None) -> bool:
        """Commit what is pending for one table; True when a snapshot was made."""
        planned = self.plan(tenant, table_name)
        if planned is None:
            return False
        table, plan = planned
        if member is not None:
            self.schedule.set_interval(member, plan.commit_interval_s)
        return self.apply(tenant, table_name, table, plan, lease)

    def plan(self, tenant: str, table_name: str) -> tuple[Table, CommitPlan] | None:
        """The table as it is now and the entries after its watermark (None when nothing is pending)."""
        table = load_table(self.catalog, tenant, table_name)
        if table is None:
            return None
        table = ensure_commit_properties(table)
        self.acknowledge_committed(tenant, table_name, table)
        stream = keys.commit_stream_key(tenant, table_name)
        raw = self.client.xrange(stream, min=f"({watermark(table)}", count=self.settings.commit_max_entries)
        plan = CommitPlan([PendingFiles.from_fields(entry_id, fields) for entry_id, fields in raw])
        return None if plan.empty else (table, plan)

    def apply(self, tenant: str, table_name: str, table: Table, plan: CommitPlan, lease: TableLease) -> bool:
        """One fast append of the plan's files, retried on conflict against a reloaded watermark."""
        started = time.perf_counter()
        # A conflict is retried on the reloaded table, against its new watermark, a bounded number
        # of times with a growing pause; the last conflict ends it (the next tick tries again).
        retrying = Retrying(
            retry=retry_if_exception_type(CommitFailedException), stop=stop_after_attempt(self.settings.commit_retries),
            wait=wait_exponential(multiplier=0.05, max=2.0), reraise=True,
        )
        for attempt in retrying:
            with attempt:
                if not lease.held():
                    raise LeadershipLost(f"{tenant}.{table_name}")
                try:
                    self._commit(table, plan, lease)
                except CommitFailedException:
                    metrics.COMMIT_FAILURES.labels(tenant, table_name, "conflict").inc()
                    # Someone else changed the table (possibly a stale leader that committed some
                    # of these very entries): reload and keep only what is still missing.
                    table = self.catalog.load_table((tenant, table_name))
                    plan = CommitPlan.after(plan.entries, watermark(table))
                    if plan.empty:
                        self.acknowledge_committed(tenant, table_name, table)
                        return False
                    raise

        fault_point(faults.COMMITTER_AFTER_CATALOG_COMMIT)
        snapshot = table.current_snapshot()
        metrics.COMMIT_SECONDS.labels(tenant, table_name).observe(time.perf_counter() - started)
        metrics.FILES_PER_COMMIT.labels(tenant, table_name).observe(len(plan.files))
        metrics.EVENTS_COMMITTED.labels(tenant, table_name).inc(plan.rows)
        log.info(
            "committed %s.%s snapshot %d: %d files, %d rows, watermark %s",
            tenant, table_name, snapshot.snapshot_id, len(plan.files), plan.rows, plan.watermark,
        )
        self.publisher.mark_committed(tenant, table_name, snapshot.snapshot_id, plan.rows_by_receipt())
        self.client.xtrim(keys.commit_stream_key(tenant, table_name), minid=next_id(plan.watermark))
        return True

    def _commit(self, table: Table, plan: CommitPlan, lease: TableLease) -> None:
        fault_point(faults.COMMITTER_BEFORE_CATALOG_COMMIT)
        summary = {
            keys.SUMMARY_COMMIT_ID: uuid.uuid4().hex,
            keys.SUMMARY_WATERMARK: plan.watermark,
            keys.SUMMARY_FENCE: str(lease.fence),
            keys.SUMMARY_COMMITTER: self.name,
        }
        with table.transaction() as transaction:
            if plan.deletes:
                # A DLQ replay: its entries leave the DLQ in the same catalog commit that adds this
                # batch's DLQ files (the append, last, carries the watermark).
                transaction.delete(In(keys.DLQ_ID, plan.deletes))
            append_files(transaction, plan.files, summary)

    def acknowledge_committed(self, tenant: str, table_name: str, table: Table) -> None:
        """Announce and drop entries the table already holds but whose receipts were not published.

        This is the recovery path for a leader that died between its catalog commit and its
        acknowledgement: the watermark in the snapshot summary says which entries made it.
        """
        stream = keys.commit_stream_key(tenant, table_name)
        mark = watermark(table)
        raw = self.client.xrange(stream, max=mark, count=self.settings.commit_max_entries)
        if not raw:
            return
        # Oldest first: each entry belongs to the first Calve snapshot whose watermark covers it.
        snapshots = list(reversed(calve_snapshots(table)))
        for entry_id, fields in raw:
            entry = PendingFiles.from_fields(entry_id, fields)
            # The oldest snapshot still kept stands in for one that expiry removed meanwhile.
            holder = next(
                (s for s in snapshots if parse_id(s.summary.additional_properties[keys.SUMMARY_WATERMARK]) >= parse_id(entry.entry_id)),
                snapshots[0],
            )
            self.publisher.mark_committed(tenant, table_name, holder.snapshot_id, entry.rows_by_receipt)
        self.client.xtrim(stream, minid=next_id(text(raw[-1][0])))
