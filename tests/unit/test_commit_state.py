"""Commit bookkeeping, without Redis or Iceberg."""

from __future__ import annotations

from service.committer.loop import next_id
from service.committer.state import CommitPlan, CommitSchedule
from service.protocol.commit_entry import FilesWritten, PendingFiles


def entry(entry_id: str, receipt: str = "r", rows: int = 1) -> PendingFiles:
    return PendingFiles(entry_id, [f"file://{entry_id}.parquet"], {receipt: rows})


def test_plan_drops_entries_at_or_below_the_watermark() -> None:
    plan = CommitPlan.after([entry("5-0"), entry("5-1"), entry("10-0")], "5-1")
    assert [e.entry_id for e in plan.entries] == ["10-0"]
    assert plan.watermark == "10-0"


def test_plan_compares_ids_numerically_not_as_text() -> None:
    plan = CommitPlan.after([entry("9-0"), entry("10-0")], "9-0")
    assert [e.entry_id for e in plan.entries] == ["10-0"]


def test_plan_merges_rows_per_receipt() -> None:
    plan = CommitPlan([entry("1-0", "a", 2), entry("2-0", "a", 3), entry("3-0", "b", 1)])
    assert plan.rows_by_receipt() == {"a": 5, "b": 1}
    assert plan.rows == 6
    assert len(plan.files) == 3


def test_schedule_commits_at_most_once_per_interval() -> None:
    schedule = CommitSchedule(interval_s=2.0)
    assert schedule.is_commit_due("t", now=100.0)
    schedule.record_commit("t", now=100.0)
    assert not schedule.is_commit_due("t", now=101.9)
    assert schedule.is_commit_due("t", now=102.0)
    assert schedule.is_commit_due("other", now=100.5)


def test_next_id_is_the_smallest_id_after() -> None:
    assert next_id("17-3") == "17-4"


def test_a_tables_own_commit_interval_comes_from_its_pending_entries() -> None:
    def streamed(entry_id: str, interval: str | None) -> PendingFiles:
        # Through the stream entry's own encoder and decoder, as the writer and committer meet.
        written = FilesWritten("demo", "logs", [], {"r": 1}, commit_interval_s=float(interval) if interval else None)
        flat = written.to_fields("writer-1")
        return PendingFiles.from_fields(entry_id, {name.encode(): value.encode() for name, value in zip(flat[::2], flat[1::2])})

    plan = CommitPlan([streamed("1-0", "5"), streamed("2-0", None), streamed("3-0", "3")])
    assert plan.commit_interval_s == 3.0, "the shortest interval among the entries"
    schedule = CommitSchedule(interval_s=1.0)
    schedule.record_commit("t", now=100.0)
    schedule.set_interval("t", plan.commit_interval_s)
    assert not schedule.is_commit_due("t", now=102.0) and schedule.is_commit_due("t", now=103.0)
    schedule.set_interval("t", CommitPlan([streamed("4-0", None)]).commit_interval_s)
    assert schedule.is_commit_due("t", now=101.0), "back to the default once the pipeline sets none"
    assert CommitPlan([streamed("5-0", None)]).deletes == []


def rewrite(entry_id: str) -> PendingFiles:
    return PendingFiles(entry_id, [f"file://{entry_id}-merged.parquet"], {}, removes=["file://a.parquet"], operation="replace")


def test_a_rewrite_is_a_snapshot_of_its_own_between_the_appends_around_it() -> None:
    plan = CommitPlan([entry("1-0"), entry("2-0"), rewrite("3-0"), entry("4-0"), rewrite("5-0"), rewrite("6-0")])
    segments = plan.segments()
    assert [[e.entry_id for e in s.entries] for s in segments] == [["1-0", "2-0"], ["3-0"], ["4-0"], ["5-0"], ["6-0"]]
    assert [s.rewrite is not None for s in segments] == [False, True, False, True, True]
    assert segments[1].watermark == "3-0", "a rewrite's snapshot carries the watermark past it"


def test_a_rewrite_entry_survives_the_stream_encoding() -> None:
    written = FilesWritten("t", "logs", ["file://m.parquet"], {}, removes=["file://a.parquet"], operation="replace", request="q1")
    fields = written.to_fields("w")
    read = PendingFiles.from_fields("7-0", {k.encode(): v.encode() for k, v in zip(fields[::2], fields[1::2])})
    assert (read.is_rewrite, read.removes, read.files, read.request) == (True, ["file://a.parquet"], ["file://m.parquet"], "q1")
    assert not PendingFiles.from_fields("8-0", {b"files": b"[]", b"receipts": b"{}"}).is_rewrite
