"""Commits of one table, by its leader: plan the entries after the watermark, make each segment's
snapshot, acknowledge the receipts; set aside what can never commit.

Per table and commit interval: read the table's watermark (the last commit-stream entry it
holds), acknowledge entries at or below it that a previous leader committed but did not get to
announce, then fast-append the files of every entry after it in one snapshot whose summary
carries the new watermark, a commit id and this leader's fence. A compare-and-swap conflict
reloads the table and filters against the new watermark before trying again, so retried or
overlapping commits never add a file twice.

Appends queued behind row changes that are not committed yet (their run not due, or being
applied) are committed ahead of them (`commit_ahead`): the summary names them beyond the watermark
(iceberg/watermark.py), the next plans leave them out, and the run of changes does not see
their files (it is applied as if they were not there yet: they came after it). The watermark
moves over them once the changes before them are committed.
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
from service.iceberg.watermark import advance, ahead, appended_ahead_since, calve_snapshots, spell_runs, watermark, within
from service.protocol.commit_entry import CommitEntry, Operation
from service.protocol.stream_ids import next_id, parse_id, text
from service.protocol.upkeep import UpkeepOutcome, UpkeepRun
from spark_jobs.contract import layout_path

log = logging.getLogger(__name__)

ISOLATE_AT_MOST = 20  # entries committed one at a time per isolation of a stuck table
MAX_AHEAD_RUNS = 16  # runs of appends committed beyond the watermark at most: more wait for the changes before them
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
        self.ahead_files: dict[str, list[str]] = {}  # by table: the files of the entries committed beyond its watermark
        self.announced: dict[str, set[str]] = {}  # by table: entries beyond its watermark whose receipts this leader published
        self.planned_to: dict[str, str] = {}  # by table: the last entry its last plan read

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
                behind = segments[index + 1:]
                # Appends queued behind the changes are committed ahead of them, and their run is
                # asked for now: a table taking appends too gets its changes in as soon as it can.
                if not run_due and member not in self.changes.asked_at and not appends_behind(behind):
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
                # entries after it are planned from the new watermark in the next round, but for
                # the appends, committed now ahead of the changes.
                committed |= self.commit_ahead(tenant, table_name, None if committed else table, behind, lease)
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

    def commit_ahead(self, tenant: str, table_name: str, table: Table | None, behind: list[CommitPlan], lease: TableLease) -> bool:
        """Commit the appends of `behind` (the segments queued behind row changes not committed
        yet) in one snapshot ahead of those changes; True when one was made. They hold no key a
        change before them may touch: the changes' run is applied without their files
        (ChangeCommits: `ahead_files`). Rewrites, DLQ replays and registered files wait their turn.
        `table`: the table as it is now (None: reloaded)."""
        entries = [entry for segment in behind if segment.operation is Operation.APPEND and not segment.deletes
                   and not segment.registered_files for entry in segment.entries]
        if not entries:
            return False
        table = table or self.reload(tenant, table_name)
        if len(ahead(table)) >= MAX_AHEAD_RUNS:
            return False
        return self.apply(tenant, table_name, table, CommitPlan(entries), lease)

    def append_waiting(self, tenant: str, table_name: str) -> bool:
        """Whether the table's newest commit-stream entry is an append that its last plan did not
        read (one now waits behind the row changes ahead of it, to be committed ahead of them)."""
        newest = self.client.xrevrange(keys.commit_stream_key(tenant, table_name), count=1)
        return bool(newest) and text(newest[0][0]) != self.planned_to.get(keys.member(tenant, table_name)) and (
            CommitEntry.from_fields(*newest[0]).operation is Operation.APPEND)

    def plan(self, tenant: str, table_name: str) -> tuple[Table, CommitPlan] | None:
        """The table as it is now and the entries after its watermark (None when nothing is pending)."""
        table = load_table(self.catalog, tenant, table_name)
        if table is None:
            return None
        table = ensure_commit_properties(table)
        self.acknowledge_committed(tenant, table_name, table)
        stream = keys.commit_stream_key(tenant, table_name)
        raw = self.client.xrange(stream, min=f"({watermark(table)}", count=self.settings.commit_max_entries)
        entries = [CommitEntry.from_fields(entry_id, fields, tenant, table_name) for entry_id, fields in raw]
        if entries:
            self.planned_to[keys.member(tenant, table_name)] = entries[-1].entry_id
        runs = ahead(table)
        held = {entry.entry_id for entry in entries if within(entry.entry_id, runs)}
        committed = [entry for entry in entries if entry.entry_id in held]
        self.ahead_files[keys.member(tenant, table_name)] = [path for entry in committed for path in entry.files]
        if committed:
            self.announce_ahead(tenant, table_name, table, committed)
        # A run of changes never spans entries committed ahead of it: they came after its first.
        breaks = frozenset(later.entry_id for earlier, later in zip(entries, entries[1:])
                           if earlier.entry_id in held and later.entry_id not in held)
        plan = CommitPlan([entry for entry in entries if entry.entry_id not in held], breaks=breaks)
        return None if plan.empty else (table, plan)

    def announce_ahead(self, tenant: str, table_name: str, table: Table, committed: list[CommitEntry]) -> None:
        """Publish the receipts of entries the table holds beyond its watermark, once per leader:
        a leader that died between such a commit and its acknowledgement left them unpublished."""
        announced = self.announced.setdefault(keys.member(tenant, table_name), set())
        announced &= {entry.entry_id for entry in committed}
        for entry in committed:
            if entry.entry_id not in announced:
                self.publisher.mark_committed(tenant, table_name, table.metadata.current_snapshot_id, entry.rows_by_receipt)
                announced.add(entry.entry_id)

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
                runs = ahead(current)
                planned = CommitPlan.after(plan.entries, watermark(current), runs)
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
        member = keys.member(tenant, table_name)
        self.publisher.mark_committed(tenant, table_name, snapshot.snapshot_id, plan.rows_by_receipt(), counts)
        mark, runs = watermark(table), ahead(table)
        if runs:  # these receipts are published: not again by this leader's next plan
            self.announced.setdefault(member, set()).update(entry.entry_id for entry in plan.entries if within(entry.entry_id, runs))
        trim_to(self.client, keys.commit_stream_key(tenant, table_name), mark)
        return True

    def _commit(self, table: Table, plan: CommitPlan, lease: TableLease) -> Rewritten | None:
        fault_point(faults.COMMITTER_BEFORE_CATALOG_COMMIT)
        summary = {
            keys.SUMMARY_COMMIT_ID: uuid.uuid4().hex,
            keys.SUMMARY_FENCE: str(lease.fence),
            keys.SUMMARY_COMMITTER: self.name,
            **self._watermark_after(table, plan),
        }
        operation = plan.operation
        if operation is Operation.REPLACE:
            with table.transaction() as transaction:
                return replace_files(table, transaction, plan.rewrite.removes, plan.rewrite.files, summary, plan.rewrite.folded)
        if operation is Operation.CHANGES or (
            operation is Operation.OVERWRITE and not appended_ahead_since(table, plan.applied.base_snapshot)
        ):
            # Only a writer's answer computed against this very snapshot (or one that appends
            # committed ahead of these changes followed) may be committed; a plan rebuilt after a
            # conflict has none, and goes back to be applied again.
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

    def _watermark_after(self, table: Table, plan: CommitPlan) -> dict[str, str]:
        """The summary's watermark (and runs beyond it) once the plan's entries are in the table
        too: it moves over every entry the table then holds from the watermark on."""
        mark, runs = watermark(table), ahead(table)
        last = max([plan.watermark, *(run[1] for run in runs)], key=parse_id)
        first = plan.entries[0]
        stream = [text(entry_id) for entry_id, _fields in self.client.xrange(
            keys.commit_stream_key(first.tenant, first.table), min=f"({mark}", max=last)]
        mark, runs = advance(mark, runs, stream, {entry.entry_id for entry in plan.entries})
        return {keys.SUMMARY_WATERMARK: mark, **({keys.SUMMARY_AHEAD: spell_runs(runs)} if runs else {})}

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
        trim_to(self.client, stream, text(raw[-1][0]))

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


def trim_to(client: redis.Redis, stream: str, mark: str) -> None:
    """Drop the commit stream's entries up to `mark` (committed and announced), exactly: an
    approximate trim removes only whole stream nodes, and an entry left in a node that a later
    entry shares outlives that entry's XDEL (a dropped rewrite, a parked entry), so an idle
    table would show a waiting entry, and be planned every interval, until its next commit."""
    client.xtrim(stream, minid=next_id(mark), approximate=False)
