"""Commit bookkeeping without I/O: when a table is due, what a commit covers."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from service.iceberg.watermark import Runs, within
from service.protocol.changes import ApplyResult
from service.protocol.commit_entry import CommitEntry, Operation
from service.protocol.stream_ids import id_after


@dataclass(frozen=True)
class CommitPlan:
    """What one Iceberg commit covers: every pending entry after the table's watermark."""

    entries: list[CommitEntry]
    applied: ApplyResult | None = None  # row changes: a writer's answer, to commit as one overwrite
    breaks: frozenset[str] = frozenset()  # entries after one committed ahead: a segment starts there

    @classmethod
    def after(cls, entries: list[CommitEntry], watermark: str, ahead: Runs = ()) -> "CommitPlan":
        # Entries at or below the watermark, or committed ahead of it, are already in the table (a
        # commit whose acknowledgement step did not finish, or another leader's commit): never
        # add them again.
        return cls([entry for entry in entries if id_after(entry.entry_id, watermark) and not within(entry.entry_id, ahead)])

    @property
    def empty(self) -> bool:
        return not self.entries

    @property
    def watermark(self) -> str:
        return self.entries[-1].entry_id

    @property
    def files(self) -> list[str]:
        """The files Calve's own writers wrote."""
        return [path for entry in self.entries if not entry.registered for path in entry.files]

    @property
    def registered_files(self) -> dict[str, dict | None]:
        """Files written elsewhere and registered, each with the api's description of it (None:
        the leader reads the file itself)."""
        registered: dict[str, dict | None] = {}
        for entry in self.entries:
            if entry.registered:
                described = entry.described or [None] * len(entry.files)
                for path, description in zip(entry.files, described, strict=True):
                    registered.setdefault(path, description)
        return registered

    @property
    def rows(self) -> int:
        return sum(sum(entry.rows_by_receipt.values()) for entry in self.entries)

    @property
    def deletes(self) -> list[str]:
        return [dlq_id for entry in self.entries for dlq_id in entry.deletes]

    @property
    def commit_interval_s(self) -> float | None:
        intervals = [entry.commit_interval_s for entry in self.entries if entry.commit_interval_s]
        return min(intervals) if intervals else None

    def segments(self) -> list[CommitPlan]:
        """The plan as the snapshots it takes, in stream order: each run of appends is one
        snapshot, each rewrite one of its own (it commits only while the files it replaces are
        live), each run of row changes of the same key one (applied together, then committed)."""
        segments: list[CommitPlan] = []
        for entry in self.entries:
            last = segments[-1].entries[-1] if segments else None
            joins = last is not None and entry.entry_id not in self.breaks and not entry.is_rewrite and not last.is_rewrite and (
                last.is_changes == entry.is_changes) and (
                not entry.is_changes or (last.keys, last.upsert) == (entry.keys, entry.upsert)
            )
            if joins:
                segments[-1].entries.append(entry)
            else:
                segments.append(CommitPlan([entry]))
        return segments

    @property
    def changes(self) -> bool:
        """A run of row changes, committed once a writer applied them."""
        return bool(self.entries) and self.entries[0].is_changes

    @property
    def operation(self) -> Operation:
        """The snapshot this plan makes: a rewrite's REPLACE, a writer's applied row changes as
        one OVERWRITE, row changes still to apply (CHANGES), else an APPEND."""
        if self.rewrite is not None:
            return Operation.REPLACE
        if self.changes:
            return Operation.OVERWRITE if self.applied is not None else Operation.CHANGES
        return Operation.APPEND

    @property
    def rewrite(self) -> CommitEntry | None:
        """The rewrite this plan commits (a segment holding one), else None."""
        return self.entries[0] if len(self.entries) == 1 and self.entries[0].is_rewrite else None

    def rows_by_receipt(self) -> dict[str, int]:
        merged: dict[str, int] = {}
        for entry in self.entries:
            for receipt, rows in entry.rows_by_receipt.items():
                merged[receipt] = merged.get(receipt, 0) + rows
        return merged


@dataclass
class CommitSchedule:
    """When a table's leader commits it. A table with files pending is committed at the latest
    one interval after its last commit (after a quiet spell, at once); sooner when its leader is
    idle: at least `min_interval_s` and its own last commit's duration after that commit, while
    the leader spent less than half of its recent time committing. So under load a hand-off waits
    for the next free moment, not for the interval, and a leader of many busy tables falls back
    to one commit per table per interval. A table whose pipeline sets its own interval keeps it
    as its schedule (whoever set it wanted that few snapshots). A table whose last commit failed
    waits its interval before the next attempt.

    A table's runs of row changes keep the interval as their schedule, from one run's asking to
    the next (`is_run_due`): a run applies every change queued when it is asked for, and its cost
    grows with the files it touches more than with the keys it changes (runs asked at each
    hand-off: 2,400 changed rows/s against 2,833 once per interval; `make bench-upsert`). What is
    queued ahead of or behind a run (appends) is committed on the schedule above."""

    interval_s: float
    min_interval_s: float = 0.0  # 0 or >= interval_s: once per interval, never sooner
    last_commit: dict[str, float] = field(default_factory=dict)
    intervals: dict[str, float] = field(default_factory=dict)  # a table's own, from its pipeline's sink
    failures: dict[str, int] = field(default_factory=dict)  # commits failed in a row, not for a passing cause
    took: dict[str, float] = field(default_factory=dict)  # each table's last commit's duration
    run_asked: dict[str, float] = field(default_factory=dict)  # when each table's last committed run of row changes was asked for
    run_took: dict[str, float] = field(default_factory=dict)  # and how long it took, from its asking to its commit
    busy: float = 0.0  # the leader's recent time spent committing, decayed by BUSY_WINDOW_S
    busy_at: float = 0.0

    BUSY_WINDOW_S = 5.0
    BUSY_SHARE = 0.5
    RUN_SPACING = 2.0  # a run is asked for no sooner than twice as long as the last took after it was asked for

    def record_failure(self, table: str) -> int:
        self.failures[table] = self.failures.get(table, 0) + 1
        return self.failures[table]

    def record_success(self, table: str) -> None:
        self.failures.pop(table, None)

    def is_commit_due(self, table: str, now: float) -> bool:
        """Whether the table's interval is up (it is committed if anything is pending)."""
        return now - self.last_commit.get(table, float("-inf")) >= self.intervals.get(table, self.interval_s)

    def may_commit_early(self, table: str, now: float) -> bool:
        """Whether the table may be committed before its interval is up, if files are pending."""
        return self.may_commit_ahead(table, now) and self.busy_share(now) < self.BUSY_SHARE

    def may_commit_ahead(self, table: str, now: float) -> bool:
        """Whether appends queued behind the table's row changes may be committed ahead of them
        now: as early commits, but however busy the leader is (with the table's own runs,
        mostly: those appends would otherwise wait for the runs, as before they could go ahead)."""
        if table in self.intervals or table in self.failures or not 0 < self.min_interval_s < self.interval_s:
            return False
        return now - self.last_commit.get(table, float("-inf")) >= max(self.min_interval_s, self.took.get(table, 0.0))

    def busy_share(self, now: float) -> float:
        """The share of the last BUSY_WINDOW_S or so that the leader spent committing."""
        return self._decayed(now) / self.BUSY_WINDOW_S

    def set_interval(self, table: str, interval_s: float | None) -> None:
        if interval_s:
            self.intervals[table] = interval_s
        else:
            self.intervals.pop(table, None)

    def record_commit(self, table: str, now: float) -> None:
        self.last_commit[table] = now

    def is_run_due(self, table: str, now: float) -> bool:
        """Whether the table's next run of row changes may be asked for: at the latest an interval
        after its last committed run was asked for (the time a writer spends applying a run is not
        added to it); sooner, RUN_SPACING times as long as that run took from its asking to its
        commit, and at least `min_interval_s`, when early commits are on and the table's pipeline
        sets no interval of its own. So cheap runs come often (a producer waiting on each of its
        changes waits less) and costly ones, which touch many files whatever their keys, no more
        than once an interval."""
        spacing = self.intervals.get(table, self.interval_s)
        if table in self.run_took and table not in self.intervals and 0 < self.min_interval_s < self.interval_s:
            spacing = min(spacing, max(self.min_interval_s, self.RUN_SPACING * self.run_took[table]))
        return now - self.run_asked.get(table, float("-inf")) >= spacing

    def record_run(self, table: str, asked: float, now: float) -> None:
        """A run of row changes asked for at `asked` is committed at `now`."""
        self.run_asked[table] = asked
        self.run_took[table] = now - asked

    def record_work(self, table: str, started: float, now: float, committed: bool) -> None:
        """Time spent on one commit of `table`, made or not (nothing pending): it counts towards
        being busy; a commit made is the table's least spacing for early commits."""
        if committed:
            self.took[table] = now - started
        self.busy = self._decayed(now) + (now - started)
        self.busy_at = now

    def _decayed(self, now: float) -> float:
        return self.busy * math.exp(-(now - self.busy_at) / self.BUSY_WINDOW_S) if self.busy else 0.0


@dataclass
class UpkeepSchedule:
    """Upkeep of a table at most once per interval; the first time it leads a table, a committer
    waits one interval (a table that changes leader often is not expired at every change)."""

    interval_s: float
    last_run: dict[str, float] = field(default_factory=dict)

    def is_upkeep_due(self, table: str, now: float) -> bool:
        last = self.last_run.setdefault(table, now)
        return now - last >= self.interval_s

    def record_upkeep(self, table: str, now: float) -> None:
        self.last_run[table] = now


@dataclass
class ChangeFailures:
    """Per table, row changes whose application failed: how many times in a row, and the entry
    that kept failing with others, to be asked for alone next (and parked if it fails alone too).
    Counted here, not by the CommitSchedule: asking a writer is no failed commit, and would reset it."""

    max_failures: int
    failures: dict[str, int] = field(default_factory=dict)
    alone: dict[str, str] = field(default_factory=dict)  # table -> the entry id to apply on its own

    def applies_alone(self, table: str, entry_id: str) -> bool:
        """Whether this entry is to be applied without the entries after it."""
        return self.alone.get(table) == entry_id

    def record_failure(self, table: str, first_entry_id: str) -> None:
        """A failed application of entries starting at `first_entry_id`; after max_failures in a
        row, that entry is applied alone."""
        self.failures[table] = self.failures.get(table, 0) + 1
        if self.failures[table] >= self.max_failures:
            self.alone[table] = first_entry_id

    def record_settled(self, table: str) -> None:
        """The table's changes were committed, or the entry that failed alone was parked."""
        self.failures.pop(table, None)
        self.alone.pop(table, None)
