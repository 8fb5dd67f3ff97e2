"""Commits of one table, by its leader: plan the entries after the watermark, make each segment's
snapshot, acknowledge the receipts; set aside what can never commit.

Per table and commit interval: read the table's watermark (the last commit-stream entry it
holds), acknowledge entries at or below it that a previous leader committed but did not get to
announce, then fast-append the files of every entry after it in one snapshot whose summary
carries the new watermark, a commit id and this leader's fence. A compare-and-swap conflict
reloads the table and filters against the new watermark before trying again, so retried or
overlapping commits never add a file twice.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable

import redis
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.expressions import In
from pyiceberg.table import Table
from tenacity import wait_exponential

from service.committer.changes import ChangeCommits
from service.committer.leases import TableLease
from service.committer.receipts import ReceiptPublisher
from service.committer.state import CommitPlan
from service.committer.upkeep import compaction_settled, record_compaction
from service.core import faults, keys, metrics
from service.core.config import Settings
from service.core.exceptions import ChangesNotApplied, LeadershipLost
from service.core.faults import fault_point
from service.iceberg.appends import append_files
from service.iceberg.catalog import CATALOG_UNAVAILABLE, ensure_commit_properties, load_table, table_identifier
from service.iceberg.conflicts import retry_on_conflict
from service.iceberg.files import catalog_io, delete_files
from service.iceberg.rewrites import Rewritten, live_data_files, overwrite_files, replace_files, row_delta
from service.iceberg.watermark import calve_snapshots, watermark
from service.protocol.commit_entry import CommitEntry, Operation
from service.protocol.stream_ids import next_id, parse_id, text
from service.protocol.upkeep import UpkeepOutcome, UpkeepRun
from spark_jobs.contract import layout_path

log = logging.getLogger(__name__)

ISOLATE_AT_MOST = 20  # entries committed one at a time per isolation of a stuck table
# Commit failures that say nothing about the entries: the catalog unreachable or busy, conflicts.
TRANSIENT: tuple[type[Exception], ...] = (*CATALOG_UNAVAILABLE, CommitFailedException)


class TableCommits:
    """What a table's leader does to commit it (the loop decides when: committer/loop.py)."""

    def __init__(self, settings: Settings, client: redis.Redis, catalog: Catalog, name: str, publisher: ReceiptPublisher) -> None:
        self.settings = settings
        self.client = client
        self.catalog = catalog
        self.name = name
        self.publisher = publisher
        self.changes = ChangeCommits(settings, client, catalog, self)
        self.waiting_for_run: set[str] = set()  # tables whose next entries are row changes whose run is not due

    def reload(self, tenant: str, table_name: str) -> Table:
        return self.catalog.load_table(table_identifier(self.catalog, tenant, table_name))

    def commit_table(
        self, tenant: str, table_name: str, lease: TableLease, on_interval: Callable[[float | None], None] | None = None,
        run_due: bool = True,
    ) -> bool:
        """Commit what is pending for one table; True when a snapshot was made. `on_interval` is
        told the commit interval the pending entries ask for (None: the default). `run_due`: a
        run of the row changes queued may be asked for (their schedule: CommitSchedule.is_run_due;
        asked for anyway when appends wait behind them);
        a run already asked for is looked after either way."""
        member = keys.member(tenant, table_name)
        self.waiting_for_run.discard(member)
        planned = self.plan(tenant, table_name)
        if planned is None:
            return False
        table, plan = planned
        if on_interval is not None:
            on_interval(plan.commit_interval_s)
        committed = False
        segments = plan.segments()
        for index, segment in enumerate(segments):
            if index:
                table = self.reload(tenant, table_name)
            if segment.changes:
                # Appends queued behind the changes wait for their run: it is asked for now.
                if not run_due and member not in self.changes.asked_at and not appends_behind(segments[index + 1:]):
                    self.waiting_for_run.add(member)
                    break
                done = self.changes.commit(tenant, table_name, table, segment, lease)
                if done:
                    # Committed, the whole segment: what follows it (appends) is committed now,
                    # up to the next row changes, whose run waits for its schedule.
                    committed, run_due = True, False
                    if self.changes.covered(member, segment):
                        continue
                # Being applied, or committed now but covering only the entries queued when it
                # was asked (the segment read since holds more), or to be applied again: the
                # entries after it wait for the next round, planned from the new watermark.
                # Going on would commit them past row changes not yet in the table.
                break
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

    def newest_is_append(self, tenant: str, table_name: str) -> bool:
        """Whether the table's newest commit-stream entry is an append (one now waits behind
        the row changes ahead of it)."""
        newest = self.client.xrevrange(keys.commit_stream_key(tenant, table_name), count=1)
        return bool(newest) and CommitEntry.from_fields(*newest[0]).operation is Operation.APPEND

    def plan(self, tenant: str, table_name: str) -> tuple[Table, CommitPlan] | None:
        """The table as it is now and the entries after its watermark (None when nothing is pending)."""
        table = load_table(self.catalog, tenant, table_name)
        if table is None:
            return None
        table = ensure_commit_properties(table)
        self.acknowledge_committed(tenant, table_name, table)
        stream = keys.commit_stream_key(tenant, table_name)
        raw = self.client.xrange(stream, min=f"({watermark(table)}", count=self.settings.commit_max_entries)
        plan = CommitPlan([CommitEntry.from_fields(entry_id, fields, tenant, table_name) for entry_id, fields in raw])
        return None if plan.empty else (table, plan)

    def apply(self, tenant: str, table_name: str, table: Table, plan: CommitPlan, lease: TableLease) -> bool:
        """One snapshot of the plan's entries, retried on conflict against a reloaded watermark;
        False when a rival leader committed them meanwhile."""
        started = time.perf_counter()

        def attempt(current: Table) -> tuple[Table, CommitPlan, Rewritten | None] | None:
            planned = plan
            if current is not table:  # reloaded after a conflict
                # Someone else changed the table (possibly a stale leader that committed some of
                # these very entries): keep only what is still missing. Applied row changes lose
                # their answer here: it was computed against the snapshot that just moved.
                planned = CommitPlan.after(plan.entries, watermark(current))
                if planned.empty:
                    self.acknowledge_committed(tenant, table_name, current)
                    return None
            if not lease.held():
                raise LeadershipLost(f"{tenant}.{table_name}")
            return current, planned, self._commit(current, planned, lease)

        # A conflict is retried on the reloaded table, against its new watermark, a bounded number
        # of times with a growing pause; the last conflict ends it (the next tick tries again).
        outcome = retry_on_conflict(
            self.catalog, table, attempt, attempts=self.settings.commit_retries, wait=wait_exponential(multiplier=0.05, max=2.0),
            on_conflict=lambda: metrics.COMMIT_FAILURES.labels(tenant, table_name, "conflict").inc(),
        )
        if outcome is None:
            return False
        table, plan, rewritten = outcome
        fault_point(faults.COMMITTER_AFTER_CATALOG_COMMIT)
        snapshot = table.current_snapshot()
        seconds = time.perf_counter() - started
        metrics.COMMIT_SECONDS.labels(tenant, table_name).observe(seconds)
        metrics.FILES_PER_COMMIT.labels(tenant, table_name).observe(len(plan.files) + len(plan.registered_files))
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

    def _commit(self, table: Table, plan: CommitPlan, lease: TableLease) -> Rewritten | None:
        fault_point(faults.COMMITTER_BEFORE_CATALOG_COMMIT)
        summary = {
            keys.SUMMARY_COMMIT_ID: uuid.uuid4().hex,
            keys.SUMMARY_WATERMARK: plan.watermark,
            keys.SUMMARY_FENCE: str(lease.fence),
            keys.SUMMARY_COMMITTER: self.name,
        }
        operation = plan.operation
        if operation is Operation.REPLACE:
            with table.transaction() as transaction:
                return replace_files(table, transaction, plan.rewrite.removes, plan.rewrite.files, summary, plan.rewrite.folded)
        if operation is Operation.CHANGES or (
            operation is Operation.OVERWRITE and plan.applied.base_snapshot != table.metadata.current_snapshot_id
        ):
            # Only a writer's answer computed against this very snapshot may be committed; a plan
            # rebuilt after a conflict has none, and goes back to be applied again.
            raise ChangesNotApplied("the table moved since the changes were applied")
        if operation is Operation.OVERWRITE:
            with table.transaction() as transaction:
                if plan.applied.deletes:  # merge-on-read
                    row_delta(table, transaction, plan.applied.adds, plan.applied.deletes, summary)
                else:
                    overwrite_files(table, transaction, plan.applied.removes, plan.applied.adds, summary)
            return None
        with table.transaction() as transaction:
            if plan.deletes:
                # A DLQ replay: its entries leave the DLQ in the same catalog commit that adds this
                # batch's DLQ files (the append, last, carries the watermark).
                transaction.delete(In(keys.DLQ_ID, plan.deletes))
            append_files(
                transaction, plan.files, summary, registered=plan.registered_files,
                live=lambda: set(live_data_files(table)),
            )
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
            entry = CommitEntry.from_fields(entry_id, fields, tenant, table_name)
            # The oldest snapshot still kept stands in for one that expiry removed meanwhile.
            holder = next(
                (s for s in snapshots if parse_id(s.summary.additional_properties[keys.SUMMARY_WATERMARK]) >= parse_id(entry.entry_id)),
                snapshots[0],
            )
            self.publisher.mark_committed(tenant, table_name, holder.snapshot_id, entry.rows_by_receipt)
        self.client.xtrim(stream, minid=next_id(text(raw[-1][0])))

    # -- what cannot commit -----------------------------------------------------------------

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
            if entry.is_changes:  # applied by a writer: ChangeCommits isolates and parks those
                return
            try:
                self.apply(tenant, table_name, table, CommitPlan([entry]), lease)
            except (LeadershipLost, *TRANSIENT):
                raise
            except Exception as exc:  # noqa: BLE001 - this entry's own failure: park it
                if entry.is_rewrite:  # optional work: dropped, not parked
                    self.drop_rewrite(tenant, table_name, entry, exc)
                    table = self.reload(tenant, table_name)
                    continue
                self.park(tenant, table_name, entry, f"commit failed alone after {self.settings.commit_max_failures} failed commits: {exc}")
                return
            table = self.reload(tenant, table_name)

    def park(self, tenant: str, table_name: str, entry: CommitEntry, reason: str) -> None:
        """Move an entry that cannot commit to the table's dead commit stream, failing its receipts
        with `reason`; the entries after it commit again. Retried or discarded by hand."""
        stream = keys.commit_stream_key(tenant, table_name)
        reason = reason[:1000]
        raw = self.client.xrange(stream, min=entry.entry_id, max=entry.entry_id)
        if raw:
            failed = self.publisher.dead_letter(tenant, table_name, entry.entry_id, raw[0][1], reason)
            metrics.DEAD_COMMIT_ENTRIES.labels(tenant, table_name).inc()
            log.error("committer: parked entry %s of %s.%s (%d receipts failed): %s", entry.entry_id, tenant, table_name, len(failed), reason)

    def drop_rewrite(self, tenant: str, table_name: str, entry: CommitEntry, exc: Exception) -> None:
        """A rewrite that cannot be committed (the files it replaces changed meanwhile, or it is
        broken): take it off the stream, then delete its files (a crash in between leaves them
        to orphan removal). The rows stay as they are; upkeep plans again from the table as it is."""
        self.client.xdel(keys.commit_stream_key(tenant, table_name), entry.entry_id)
        delete_files([*entry.files, *map(layout_path, entry.files)], catalog_io(self.catalog))
        compaction_settled(self.client, tenant, table_name, entry.request)
        metrics.COMPACTIONS_DROPPED.labels(tenant, table_name).inc()
        log.warning("committer: dropped the compaction %s of %s.%s: %s", entry.entry_id, tenant, table_name, exc)
        record_compaction(self.client, tenant, table_name, UpkeepRun(UpkeepOutcome.DROPPED, request=entry.request, error=str(exc)[:500]))

    def _compaction_committed(self, tenant: str, table_name: str, entry: CommitEntry, rewritten: Rewritten, snapshot_id: int) -> None:
        compaction_settled(self.client, tenant, table_name, entry.request)
        delete_files([layout_path(path) for path in entry.files], catalog_io(self.catalog))  # needed until the commit only
        metrics.COMPACTION_FILES.labels(tenant, table_name, "removed").inc(rewritten.files_removed)
        metrics.COMPACTION_FILES.labels(tenant, table_name, "added").inc(rewritten.files_added)
        metrics.COMPACTION_BYTES.labels(tenant, table_name).inc(rewritten.bytes_removed)
        log.info(
            "compacted %s.%s snapshot %d: %d files (%d bytes) into %d (%d bytes), %d rows, %d delete files folded in or dropped",
            tenant, table_name, snapshot_id, rewritten.files_removed, rewritten.bytes_removed,
            rewritten.files_added, rewritten.bytes_added, rewritten.rows, rewritten.delete_files_removed,
        )
        record_compaction(self.client, tenant, table_name, UpkeepRun(UpkeepOutcome.OK, request=entry.request, facts={
            "snapshot_id": snapshot_id, "files_rewritten": rewritten.files_removed, "files_written": rewritten.files_added,
            "bytes_rewritten": rewritten.bytes_removed, "bytes_written": rewritten.bytes_added, "rows": rewritten.rows,
            "delete_files_removed": rewritten.delete_files_removed,
        }))


def appends_behind(segments: list[CommitPlan]) -> bool:
    """Whether one of these segments (those behind a run of row changes) is appends."""
    return any(segment.operation is Operation.APPEND for segment in segments)
