"""The committer: one leader per table turns written files into Iceberg snapshots.

Per table and commit interval: read the table's watermark (the last commit-stream entry it
holds), acknowledge entries at or below it that a previous leader committed but did not get to
announce, then fast-append the files of every entry after it in one snapshot whose summary
carries the new watermark, a commit id and this leader's fence. A compare-and-swap conflict
reloads the table and filters against the new watermark before trying again, so retried or
overlapping commits never add a file twice.
"""

from __future__ import annotations

import contextlib
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
from sqlmodel import Session
from tenacity import (
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
)

from service.committer.feeds import FeedPump
from service.committer.leases import TableLease
from service.committer.receipts import ReceiptPublisher
from service.committer.state import CommitPlan, CommitSchedule, UpkeepSchedule
from service.core import faults, keys, metrics
from service.core.config import Settings
from service.core.db import get_engine
from service.core.exceptions import ChangesFailed, ChangesNotApplied, FilesNotLive, LeadershipLost
from service.core.faults import fault_point
from service.core.identity import consumer_name
from service.feeds.consumers import protected_snapshots
from service.iceberg.appends import append_files
from service.iceberg.catalog import (
    CATALOG_UNAVAILABLE,
    ensure_commit_properties,
    load_table,
    table_identifier,
)
from service.iceberg.compaction import CompactionPolicy, plan_compaction
from service.iceberg.files import catalog_io, delete_files
from service.iceberg.rewrites import Rewritten, live_data_files, overwrite_files, replace_files
from service.iceberg.upkeep import (
    ExpiryPolicy,
    expire_snapshots,
    merge_manifests,
    remove_orphans,
)
from service.iceberg.watermark import calve_snapshots, watermark
from service.protocol import changes, commit_entry
from service.protocol.changes import ApplyRequest, ApplyResult
from service.protocol.commit_entry import PendingFiles
from service.protocol.compaction import CompactionRequest
from service.protocol.heartbeats import Heartbeats
from service.protocol.stream_ids import id_after, parse_id, text
from service.protocol.upkeep import record_upkeep

log = logging.getLogger(__name__)

TICK_S = 0.1
FEED_INTERVAL_S = 1.0  # how often a table's leader looks for changes to feed its pipelines
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
        self.feed_schedule = UpkeepSchedule(FEED_INTERVAL_S)
        self.feeds = FeedPump(settings, client)
        # Per table: failed applications of row changes in a row, and the changes entry that kept
        # failing with others (asked alone next; parked if it fails alone too).
        self.change_failures: dict[str, int] = {}
        self.apply_alone: dict[str, str] = {}
        self.expiry = ExpiryPolicy(settings.snapshot_max_age_s, settings.snapshot_max_count, settings.snapshot_min_count)
        self.compaction = CompactionPolicy.from_settings(settings)
        self.leases: dict[str, TableLease] = {}
        self.publisher = ReceiptPublisher(client)

    def run(self, stop: threading.Event) -> None:
        log.info("committer %s started", self.name)
        heartbeats = Heartbeats(self.client, "committer", self.name)
        while not stop.is_set():
            try:
                heartbeats.beat(leads=len(self.leases))
                self.tick()
            except redis.RedisError as exc:
                log.warning("committer: Redis unavailable (%s); retrying", exc)
                stop.wait(1.0)
                continue
            stop.wait(TICK_S)
        self.drain()
        self.release_all()
        with contextlib.suppress(redis.RedisError):
            heartbeats.stop()
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
        asked = {text(m) for m in self.client.smembers(keys.MAINTENANCE)}
        for member in sorted(text(m) for m in self.client.smembers(keys.TABLES)):
            lease = self.lease(member)
            if lease is None:
                continue
            now = time.monotonic()
            tenant, table = keys.split_member(member)
            if member in asked:
                self.maintain(tenant, table, lease)
            if self.upkeep_schedule.is_upkeep_due(member, now):
                self.upkeep(tenant, table, lease)
                self.upkeep_schedule.record_upkeep(member, now)
            if self.orphan_schedule.is_upkeep_due(member, now):
                self.remove_orphans(tenant, table, lease)
                self.orphan_schedule.record_upkeep(member, now)
            if self.feed_schedule.is_upkeep_due(member, now):
                self.pump_feeds(tenant, table)
                self.feed_schedule.record_upkeep(member, now)
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

    def pump_feeds(self, tenant: str, table_name: str) -> None:
        """Put the table's new changes on the input of the pipelines it feeds (committer/feeds.py)."""
        try:
            self.feeds.pump(tenant, table_name, lambda: self.catalog.load_table(table_identifier(self.catalog, tenant, table_name)))
        except Exception:  # noqa: BLE001 - retried next time; one table's feeds must not stop the others
            log.exception("committer: feeding the pipelines of %s/%s failed; will retry", tenant, table_name)

    def isolate_stuck(self, tenant: str, table_name: str, lease: TableLease) -> None:
        """The table's commits kept failing for a cause that does not pass: commit its pending
        entries one at a time, and park each that fails alone on the dead commit stream (its
        receipts failed with the reason), so the entries after it commit again."""
        planned = self.plan(tenant, table_name)
        if planned is None:
            return
        table, plan = planned
        # Bounded, as this runs in the loop every table shares: after the first entry parked (or
        # ISOLATE_AT_MOST committed alone) the table goes back to committing in batches, and a
        # second bad entry is found the same way later.
        for entry in plan.entries[:ISOLATE_AT_MOST]:
            if entry.is_changes:  # applied by a writer: commit_changes isolates and parks those
                return
            try:
                self.apply(tenant, table_name, table, CommitPlan([entry]), lease)
            except (LeadershipLost, *TRANSIENT):
                raise
            except Exception as exc:  # noqa: BLE001 - this entry's own failure: park it
                if entry.is_rewrite:  # optional work: dropped, not parked
                    self.drop_rewrite(tenant, table_name, entry, exc)
                    table = self.catalog.load_table(table_identifier(self.catalog, tenant, table_name))
                    continue
                self.park(tenant, table_name, entry, f"commit failed alone after {self.settings.commit_max_failures} failed commits: {exc}")
                return
            table = self.catalog.load_table(table_identifier(self.catalog, tenant, table_name))

    def park(self, tenant: str, table_name: str, entry: PendingFiles, reason: str) -> None:
        """Move an entry that cannot commit to the table's dead commit stream, failing its receipts
        with `reason`; the entries after it commit again. Retried or discarded by hand."""
        stream = keys.commit_stream_key(tenant, table_name)
        reason = reason[:1000]
        raw = self.client.xrange(stream, min=entry.entry_id, max=entry.entry_id)
        if raw:
            failed = self.publisher.dead_letter(tenant, table_name, entry.entry_id, raw[0][1], reason)
            metrics.DEAD_COMMIT_ENTRIES.labels(tenant, table_name).inc()
            log.error("committer: parked entry %s of %s.%s (%d receipts failed): %s", entry.entry_id, tenant, table_name, len(failed), reason)

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
        work = {
            "expire": self._expire, "orphans": self._orphans, "manifests": self._merge_manifests,
            "compact": lambda t, n, table: self._request_compaction(t, n, table, asked["compact"]),
        }
        for task in ("manifests", "expire", "compact", "orphans"):  # compaction plans on merged manifests
            if task in asked:
                self._run_upkeep(task, tenant, table_name, lease, work[task], asked[task])

    def upkeep(self, tenant: str, table_name: str, lease: TableLease) -> None:
        """Expire what the table's policy lets go, and ask for a compaction where small files
        piled up; only its leader does, between its commits."""
        self._run_upkeep("expire", tenant, table_name, lease, self._expire)
        self._run_upkeep("compact", tenant, table_name, lease, self._request_compaction)

    def remove_orphans(self, tenant: str, table_name: str, lease: TableLease) -> None:
        """Delete what nothing references: not the table's snapshots, and not the entries waiting
        on its commit stream or parked on its dead commit stream."""
        self._run_upkeep("orphans", tenant, table_name, lease, self._orphans)

    def _expire(self, tenant: str, table_name: str, table: Table) -> dict[str, int]:
        with Session(get_engine(self.settings.resolved_database_url())) as session:
            held = protected_snapshots(session, tenant, table_name, table, self.settings.consumer_max_lag_s)
        result = expire_snapshots(table, self.expiry, held)
        metrics.SNAPSHOTS_EXPIRED.labels(tenant, table_name).inc(len(result.expired))
        return {"snapshots_expired": len(result.expired), "files_deleted": result.files_deleted}

    def _request_compaction(self, tenant: str, table_name: str, table: Table, asked: str | None = None) -> dict | None:
        """Plan a compaction and hand it to the writers (who run it on Spark); its rewrite comes
        back on the commit stream. One at a time per table. Asked for by hand (`asked`: the
        request's id), any partition with two small files qualifies, and the outcome is recorded
        even when there is nothing to do; otherwise None means nothing to record."""
        if self.client.exists(keys.compacting_key(tenant, table_name)):
            return {"outcome": "busy", "detail": "a compaction of this table is already running"} if asked else None
        policy = self.compaction.for_table(table)
        if asked:
            policy = CompactionPolicy(policy.target_file_bytes, 2, policy.max_bytes)
        groups = plan_compaction(live_data_files(table).values(), policy, table.spec().spec_id) if table.current_snapshot() else []
        if not groups:
            return {"outcome": "ok", "requested_files": 0, "detail": "no partition holds two small files"} if asked else None
        request = CompactionRequest(tenant, table_name, asked or uuid.uuid4().hex, [
            ([file.file_path for file in group.files], group.outputs) for group in groups
        ])
        if not self.client.set(keys.compacting_key(tenant, table_name), request.request, nx=True, ex=int(self.settings.compact_timeout_s)):
            return None
        self.client.rpush(keys.COMPACTIONS, request.to_json())
        log.info("upkeep: asked for a compaction of %d files of %s.%s (%d partitions)", len(request.files), tenant, table_name, len(groups))
        return {"requested_files": len(request.files), "partitions": len(groups), "outcome": "requested", "request": request.request}

    def _merge_manifests(self, _tenant: str, _table_name: str, table: Table) -> dict[str, int]:
        return {"manifests_merged": merge_manifests(table)}

    def _orphans(self, tenant: str, table_name: str, table: Table) -> dict[str, int]:
        waiting: set[str] = set()
        for stream in (keys.commit_stream_key(tenant, table_name), keys.dead_commit_stream_key(tenant, table_name)):
            for _entry_id, fields in self.client.xrange(stream):
                waiting.update(orjson.loads(fields[commit_entry.FILES.encode()]))
        return {"files_deleted": remove_orphans(table, self.settings.orphan_min_age_s, waiting)}

    def _run_upkeep(
        self, task: str, tenant: str, table_name: str, lease: TableLease, work: Callable[[str, str, Table], dict | None],
        asked: str | None = None,
    ) -> None:
        """One upkeep task on a table this committer leads, counted, timed and recorded for the
        table's health; a failure is logged and retried next interval, never stops the commits."""
        started = time.perf_counter()
        try:
            table = load_table(self.catalog, tenant, table_name)
            if table is None or not lease.held():
                return
            record = work(tenant, table_name, table)
        except Exception as exc:  # noqa: BLE001 - upkeep failing must not stop commits; next interval retries
            metrics.UPKEEP_RUNS.labels(task, "failed").inc()
            log.warning("upkeep %s of %s.%s failed (%s); will retry", task, tenant, table_name, exc)
            self._record_upkeep(tenant, table_name, task, {"outcome": "failed", "error": str(exc)[:500], "request": asked})
            return
        seconds = time.perf_counter() - started
        metrics.UPKEEP_RUNS.labels(task, "ok").inc()
        metrics.UPKEEP_SECONDS.labels(task).observe(seconds)
        if record is None:
            return
        metrics.UPKEEP_FILES_DELETED.labels(tenant, table_name).inc(record.get("files_deleted", 0))
        if any(record.values()) or asked:
            log.info("upkeep %s of %s.%s: %s", task, tenant, table_name, record)
        self._record_upkeep(tenant, table_name, task, {"outcome": "ok", "request": asked, **record, "seconds": round(seconds, 3)})

    def _record_upkeep(self, tenant: str, table_name: str, task: str, outcome: dict) -> None:
        record_upkeep(self.client, tenant, table_name, task, outcome)

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
        segments = plan.segments()
        committed = False
        for index, segment in enumerate(segments):
            if index:
                table = self.catalog.load_table(table_identifier(self.catalog, tenant, table_name))
            if segment.changes:
                done = self.commit_changes(tenant, table_name, table, segment, lease)
                if done is None:
                    break  # being applied: the entries after it wait their turn (order is the point)
                committed |= done
                continue
            if segment.rewrite is None:
                committed |= self.apply(tenant, table_name, table, segment, lease)
                continue
            try:
                committed |= self.apply(tenant, table_name, table, segment, lease)
            except (LeadershipLost, *TRANSIENT):
                raise
            except Exception as exc:  # noqa: BLE001 - a rewrite is optional work: never let it block the table
                self.drop_rewrite(tenant, table_name, segment.rewrite, exc)
        return committed

    def commit_changes(self, tenant: str, table_name: str, table: Table, segment: CommitPlan, lease: TableLease) -> bool | None:
        """Row changes: ask a writer to apply them against the table as it is now, then commit its
        answer as one overwrite if the table is still there. None while the answer is awaited."""
        key = keys.applying_key(tenant, table_name)
        member = keys.member(tenant, table_name)
        if self.apply_alone.get(member) == segment.entries[0].entry_id:
            segment = CommitPlan(segment.entries[:1])  # it failed with the others: on its own now
        state = self.client.hgetall(key)
        current = table.metadata.current_snapshot_id
        request = ApplyRequest.from_json(state[changes.REQUEST.encode()]) if changes.REQUEST.encode() in state else None
        if request is None or request.entries[0][0] != segment.entries[0].entry_id:
            self._ask_apply(tenant, table_name, segment, current)
            return None
        raw = state.get(changes.RESULT.encode())
        if raw is None:
            return None
        result = ApplyResult.from_json(raw)
        if result.request != request.request:
            return None
        if result.error:
            self.client.delete(key)
            if len(request.entries) == 1 and self.apply_alone.get(member) == request.entries[0][0]:
                del self.apply_alone[member]
                self.change_failures.pop(member, None)
                self.park(tenant, table_name, segment.entries[0], f"row changes failed to apply on their own: {result.error}")
                return False
            # Counted here, not by the commit schedule: asking a writer is no failure, and would reset it.
            failures = self.change_failures[member] = self.change_failures.get(member, 0) + 1
            if failures >= self.settings.commit_max_failures:
                self.apply_alone[member] = segment.entries[0].entry_id
            raise ChangesFailed(result.error)
        covered = CommitPlan([e for e in segment.entries if not id_after(e.entry_id, request.last_entry)], applied=result)
        try:
            if result.base_snapshot != current:
                raise ChangesNotApplied(f"snapshot {current} is not {result.base_snapshot}, which they were applied to")
            committed = self.apply(tenant, table_name, table, covered, lease)
        except (ChangesNotApplied, FilesNotLive) as exc:
            metrics.CHANGES_REAPPLIED.labels(tenant, table_name).inc()
            log.info("committer: %s.%s moved while its changes were applied (%s); applying them again", tenant, table_name, exc)
            committed = False
        self.client.delete(key)
        if not committed:  # the table moved since the request (or a rival leader committed them)
            delete_files(result.adds, catalog_io(self.catalog))
            return False
        delete_files(covered.files, catalog_io(self.catalog))  # the change files: applied and committed
        self.apply_alone.pop(member, None)
        self.change_failures.pop(member, None)
        return True

    def _ask_apply(self, tenant: str, table_name: str, segment: CommitPlan, current: int | None) -> None:
        first = segment.entries[0]
        request = ApplyRequest(tenant, table_name, uuid.uuid4().hex, current,
                               [(entry.entry_id, entry.files) for entry in segment.entries], first.keys, first.upsert)
        key = keys.applying_key(tenant, table_name)
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(key)
        pipe.hset(key, changes.REQUEST, request.to_json())
        pipe.expire(key, int(self.settings.apply_timeout_s))
        pipe.execute()
        # Queued after: a crash in between leaves a request no writer saw, asked again after
        # apply_timeout_s, as a request lost with its writer is.
        self.client.rpush(keys.APPLIES, request.to_json())

    def drop_rewrite(self, tenant: str, table_name: str, entry: PendingFiles, exc: Exception) -> None:
        """A rewrite that cannot be committed (the files it replaces changed meanwhile, or it is
        broken): take it off the stream, then delete its files (a crash in between leaves them
        to orphan removal). The rows stay as they are; upkeep plans again from the table as it is."""
        self.client.xdel(keys.commit_stream_key(tenant, table_name), entry.entry_id)
        delete_files(entry.files, catalog_io(self.catalog))
        self._rewrite_settled(tenant, table_name, entry)
        metrics.COMPACTIONS_DROPPED.labels(tenant, table_name).inc()
        log.warning("committer: dropped the compaction %s of %s.%s: %s", entry.entry_id, tenant, table_name, exc)
        self._record_upkeep(tenant, table_name, "compact", {
            "outcome": "dropped", "error": str(exc)[:500], "request": entry.request,
        })

    def _rewrite_settled(self, tenant: str, table_name: str, entry: PendingFiles) -> None:
        marker = keys.compacting_key(tenant, table_name)
        if entry.request and text(self.client.get(marker) or b"") == entry.request:
            self.client.delete(marker)

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
        rewritten = None
        for attempt in retrying:
            with attempt:
                if not lease.held():
                    raise LeadershipLost(f"{tenant}.{table_name}")
                try:
                    rewritten = self._commit(table, plan, lease)
                except CommitFailedException:
                    metrics.COMMIT_FAILURES.labels(tenant, table_name, "conflict").inc()
                    # Someone else changed the table (possibly a stale leader that committed some
                    # of these very entries): reload and keep only what is still missing.
                    table = self.catalog.load_table(table_identifier(self.catalog, tenant, table_name))
                    plan = CommitPlan.after(plan.entries, watermark(table))
                    if plan.empty:
                        self.acknowledge_committed(tenant, table_name, table)
                        return False
                    raise

        fault_point(faults.COMMITTER_AFTER_CATALOG_COMMIT)
        snapshot = table.current_snapshot()
        seconds = time.perf_counter() - started
        metrics.COMMIT_SECONDS.labels(tenant, table_name).observe(seconds)
        metrics.FILES_PER_COMMIT.labels(tenant, table_name).observe(len(plan.files))
        metrics.EVENTS_COMMITTED.labels(tenant, table_name).inc(plan.rows)
        if rewritten is not None:
            self._compaction_committed(tenant, table_name, plan.rewrite, rewritten, snapshot.snapshot_id)
        else:
            log.info(
                "committed %s.%s snapshot %d: %d files, %d rows, watermark %s, in %.3f s",
                tenant, table_name, snapshot.snapshot_id, len(plan.files), plan.rows, plan.watermark, seconds,
            )
        counts = plan.applied.counts if plan.applied is not None else None
        self.publisher.mark_committed(tenant, table_name, snapshot.snapshot_id, plan.rows_by_receipt(), counts)
        self.client.xtrim(keys.commit_stream_key(tenant, table_name), minid=next_id(plan.watermark))
        return True

    def _compaction_committed(self, tenant: str, table_name: str, entry: PendingFiles, rewritten: Rewritten, snapshot_id: int) -> None:
        self._rewrite_settled(tenant, table_name, entry)
        metrics.COMPACTION_FILES.labels(tenant, table_name, "removed").inc(rewritten.files_removed)
        metrics.COMPACTION_FILES.labels(tenant, table_name, "added").inc(rewritten.files_added)
        metrics.COMPACTION_BYTES.labels(tenant, table_name).inc(rewritten.bytes_removed)
        log.info(
            "compacted %s.%s snapshot %d: %d files (%d bytes) into %d (%d bytes), %d rows",
            tenant, table_name, snapshot_id, rewritten.files_removed, rewritten.bytes_removed,
            rewritten.files_added, rewritten.bytes_added, rewritten.rows,
        )
        self._record_upkeep(tenant, table_name, "compact", {
            "outcome": "ok", "request": entry.request, "snapshot_id": snapshot_id, "files_rewritten": rewritten.files_removed,
            "files_written": rewritten.files_added, "bytes_rewritten": rewritten.bytes_removed, "bytes_written": rewritten.bytes_added,
            "rows": rewritten.rows,
        })

    def _commit(self, table: Table, plan: CommitPlan, lease: TableLease) -> Rewritten | None:
        fault_point(faults.COMMITTER_BEFORE_CATALOG_COMMIT)
        summary = {
            keys.SUMMARY_COMMIT_ID: uuid.uuid4().hex,
            keys.SUMMARY_WATERMARK: plan.watermark,
            keys.SUMMARY_FENCE: str(lease.fence),
            keys.SUMMARY_COMMITTER: self.name,
        }
        if plan.rewrite is not None:
            with table.transaction() as transaction:
                return replace_files(table, transaction, plan.rewrite.removes, plan.rewrite.files, summary)
        if plan.changes:
            # Only a writer's answer computed against this very snapshot may be committed; a plan
            # rebuilt after a conflict has none, and goes back to be applied again.
            if plan.applied is None or plan.applied.base_snapshot != table.metadata.current_snapshot_id:
                raise ChangesNotApplied("the table moved since the changes were applied")
            with table.transaction() as transaction:
                overwrite_files(table, transaction, plan.applied.removes, plan.applied.adds, summary)
            return None
        with table.transaction() as transaction:
            if plan.deletes:
                # A DLQ replay: its entries leave the DLQ in the same catalog commit that adds this
                # batch's DLQ files (the append, last, carries the watermark).
                transaction.delete(In(keys.DLQ_ID, plan.deletes))
            append_files(transaction, plan.files, summary)
        return None

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
