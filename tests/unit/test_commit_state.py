"""Commit bookkeeping, without Redis or Iceberg."""

from __future__ import annotations

from service.committer.state import ChangeFailures, CommitPlan, CommitSchedule
from service.iceberg.watermark import advance, parse_runs, spell_runs, within
from service.protocol.commit_entry import CommitEntry, Operation
from service.protocol.stream_ids import next_id
from service.protocol.upkeep import UpkeepOutcome, UpkeepRun


def entry(entry_id: str, receipt: str = "r", rows: int = 1) -> CommitEntry:
    return CommitEntry("demo", "logs", [f"file://{entry_id}.parquet"], {receipt: rows}, entry_id=entry_id)


def read_back(entry_id: str, written: CommitEntry) -> CommitEntry:
    """Through the stream entry's own encoder and decoder, as the writer and committer meet."""
    flat = written.to_fields("writer-1")
    return CommitEntry.from_fields(entry_id, {name.encode(): value.encode() for name, value in zip(flat[::2], flat[1::2], strict=True)})


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


def test_the_watermark_moves_over_entries_committed_ahead_once_those_before_them_are_in() -> None:
    stream = ["2-0", "3-0", "4-0", "5-0", "6-0"]
    # Appends behind changes 2-0 committed ahead of them: named beyond the watermark, in runs.
    mark, runs = advance("1-0", (), stream[:4], {"3-0", "4-0"})
    assert (mark, runs) == ("1-0", (("3-0", "4-0"),))
    assert within("3-0", runs) and within("4-0", runs) and not within("2-0", runs) and not within("10-0", runs)
    mark, runs = advance(mark, runs, stream, {"6-0"})  # 5-0 (more changes) still waits
    assert (mark, runs) == ("1-0", (("3-0", "4-0"), ("6-0", "6-0")))
    assert parse_runs(spell_runs(runs)) == runs
    mark, runs = advance(mark, runs, stream, {"2-0"})  # the changes' run: the watermark moves over the appends
    assert (mark, runs) == ("4-0", (("6-0", "6-0"),))
    assert advance(mark, runs, stream[3:], {"5-0"}) == ("6-0", ())
    # An entry gone from the stream (parked) is no gap.
    assert advance("1-0", (), ["3-0"], {"3-0"}) == ("3-0", ())


def test_a_run_of_changes_never_spans_an_entry_committed_ahead_of_it() -> None:
    changes = [read_back(entry_id, CommitEntry("demo", "people", [f"file://{entry_id}"], {"r": 1}, operation=Operation.CHANGES,
                                               keys=["id"], upsert=True)) for entry_id in ("1-0", "3-0")]
    assert len(CommitPlan(changes).segments()) == 1
    assert [len(segment.entries) for segment in CommitPlan(changes, breaks=frozenset({"3-0"})).segments()] == [1, 1]
    plan = CommitPlan.after([entry("1-0"), entry("2-0"), entry("3-0")], "0-0", (("2-0", "2-0"),))
    assert [e.entry_id for e in plan.entries] == ["1-0", "3-0"]


def test_appends_behind_row_changes_are_committed_ahead_of_them_however_busy_the_leader() -> None:
    # The leader busy with the table's runs makes no early commits; appends queued behind those
    # runs still go ahead of them, spaced as early commits are.
    schedule = CommitSchedule(interval_s=1.0, min_interval_s=0.2)
    schedule.record_work("t", started=100.0, now=103.0, committed=True)  # a busy leader
    schedule.record_commit("t", now=103.0)
    assert not schedule.may_commit_early("t", now=103.5) and not schedule.is_commit_due("t", now=103.5)
    assert not schedule.may_commit_ahead("t", now=103.1), "no sooner than the last commit took"
    schedule.record_work("t", started=103.5, now=103.6, committed=True)
    assert schedule.may_commit_ahead("t", now=103.8) and not schedule.may_commit_early("t", now=103.8)
    schedule.set_interval("t", 5.0)
    assert not schedule.may_commit_ahead("t", now=103.8), "a pipeline's own interval is kept"


def test_schedule_commits_at_most_once_per_interval() -> None:
    schedule = CommitSchedule(interval_s=2.0)
    assert schedule.is_commit_due("t", now=100.0)
    schedule.record_commit("t", now=100.0)
    assert not schedule.is_commit_due("t", now=101.9)
    assert schedule.is_commit_due("t", now=102.0)
    assert schedule.is_commit_due("other", now=100.5)


def test_an_idle_leader_commits_before_the_interval_a_busy_one_once_per_interval() -> None:
    schedule = CommitSchedule(interval_s=1.0, min_interval_s=0.2)
    schedule.record_work("t", started=100.0, now=100.1, committed=True)
    schedule.record_commit("t", now=100.0)
    assert not schedule.may_commit_early("t", now=100.15), "not sooner than the least interval"
    assert schedule.may_commit_early("t", now=100.2) and not schedule.is_commit_due("t", now=100.2)
    schedule.record_work("slow", started=100.0, now=100.5, committed=True)
    schedule.record_commit("slow", now=100.0)
    assert not schedule.may_commit_early("slow", now=100.3), "not sooner than its own last commit took"
    assert schedule.may_commit_early("slow", now=100.5)

    busy = CommitSchedule(interval_s=1.0, min_interval_s=0.2)
    for second in range(10):  # 0.6 s of every second spent committing
        busy.record_work("t", started=100.0 + second, now=100.6 + second, committed=True)
        busy.record_commit("t", now=100.0 + second)
    assert busy.busy_share(110.0) > 0.5
    assert not busy.may_commit_early("t", now=109.9) and busy.is_commit_due("t", now=110.0), "busy: once per interval"
    assert busy.may_commit_early("t", now=120.0), "idle again once the busy spell is past"

    schedule.record_failure("t")
    assert not schedule.may_commit_early("t", now=100.5), "a failed commit waits its interval"
    schedule.record_success("t")
    assert schedule.may_commit_early("t", now=100.5)
    schedule.set_interval("t", 5.0)
    assert not schedule.may_commit_early("t", now=100.5), "a table's own interval is its schedule"
    assert not CommitSchedule(interval_s=1.0, min_interval_s=1.0).may_commit_early("t", now=100.0), "least = interval: never sooner"
    assert not CommitSchedule(interval_s=1.0).may_commit_early("t", now=100.0)


def test_runs_of_row_changes_are_asked_for_once_per_interval_from_one_asking_to_the_next() -> None:
    schedule = CommitSchedule(interval_s=1.0, min_interval_s=0.2)
    assert schedule.is_run_due("t", now=100.0), "the first run at once"
    schedule.record_work("t", started=100.6, now=100.7, committed=True)
    schedule.record_commit("t", now=100.6)
    schedule.record_run("t", asked=100.0, now=100.6)  # the run took 0.6 s to apply and commit
    assert not schedule.is_run_due("t", now=100.9) and schedule.is_run_due("t", now=101.0), "the interval from the asking, not the commit"
    assert schedule.may_commit_early("t", now=100.9), "appends queued behind it are committed early meanwhile"
    schedule.record_commit("t", now=100.9)
    assert schedule.is_run_due("t", now=101.0), "an append's commit does not put the next run off"
    schedule.record_run("t", asked=101.0, now=101.3)  # a cheap run: the next one sooner than the interval
    assert not schedule.is_run_due("t", now=101.55) and schedule.is_run_due("t", now=101.6), "twice as long as it took"
    schedule.record_run("t", asked=102.0, now=102.05)
    assert not schedule.is_run_due("t", now=102.15) and schedule.is_run_due("t", now=102.2), "at least the least interval"
    assert not CommitSchedule(interval_s=1.0, min_interval_s=1.0, run_took={"t": 0.1}, run_asked={"t": 100.0}).is_run_due("t", now=100.5), (
        "early commits off: once per interval")
    schedule.set_interval("t", 3.0)
    assert not schedule.is_run_due("t", now=104.0) and schedule.is_run_due("t", now=105.0), "a sink's own interval spaces its runs"


def test_next_id_is_the_smallest_id_after() -> None:
    assert next_id("17-3") == "17-4"


def test_a_tables_own_commit_interval_comes_from_its_pending_entries() -> None:
    def streamed(entry_id: str, interval: str | None) -> CommitEntry:
        return read_back(entry_id, CommitEntry("demo", "logs", [], {"r": 1}, commit_interval_s=float(interval) if interval else None))

    plan = CommitPlan([streamed("1-0", "5"), streamed("2-0", None), streamed("3-0", "3")])
    assert plan.commit_interval_s == 3.0, "the shortest interval among the entries"
    schedule = CommitSchedule(interval_s=1.0)
    schedule.record_commit("t", now=100.0)
    schedule.set_interval("t", plan.commit_interval_s)
    assert not schedule.is_commit_due("t", now=102.0) and schedule.is_commit_due("t", now=103.0)
    schedule.set_interval("t", CommitPlan([streamed("4-0", None)]).commit_interval_s)
    assert schedule.is_commit_due("t", now=101.0), "back to the default once the pipeline sets none"
    assert CommitPlan([streamed("5-0", None)]).deletes == []


def rewrite(entry_id: str) -> CommitEntry:
    return CommitEntry("demo", "logs", [f"file://{entry_id}-merged.parquet"], {}, Operation.REPLACE, removes=["file://a.parquet"], entry_id=entry_id)


def test_a_rewrite_is_a_snapshot_of_its_own_between_the_appends_around_it() -> None:
    plan = CommitPlan([entry("1-0"), entry("2-0"), rewrite("3-0"), entry("4-0"), rewrite("5-0"), rewrite("6-0")])
    segments = plan.segments()
    assert [[e.entry_id for e in s.entries] for s in segments] == [["1-0", "2-0"], ["3-0"], ["4-0"], ["5-0"], ["6-0"]]
    assert [s.rewrite is not None for s in segments] == [False, True, False, True, True]
    assert segments[1].watermark == "3-0", "a rewrite's snapshot carries the watermark past it"


def test_a_rewrite_entry_survives_the_stream_encoding() -> None:
    written = CommitEntry("t", "logs", ["file://m.parquet"], {}, Operation.REPLACE, removes=["file://a.parquet"], request="q1")
    read = read_back("7-0", written)
    assert (read.is_rewrite, read.removes, read.files, read.request) == (True, ["file://a.parquet"], ["file://m.parquet"], "q1")
    assert not CommitEntry.from_fields("8-0", {b"files": b"[]", b"receipts": b"{}"}).is_rewrite


def test_row_changes_survive_the_stream_encoding_and_plan_as_their_own_snapshot() -> None:
    changes = CommitEntry("t", "people", ["file://c.parquet"], {"r": 2}, Operation.CHANGES, keys=["id"], upsert=True)
    read = read_back("9-0", changes)
    assert (read.operation, read.keys, read.upsert, read.entry_id) == (Operation.CHANGES, ["id"], True, "9-0")
    plan = CommitPlan([entry("8-0"), read])
    assert [s.operation for s in plan.segments()] == [Operation.APPEND, Operation.CHANGES]


def test_an_entry_written_before_operations_were_named_reads_as_an_append() -> None:
    read = CommitEntry.from_fields("1-0", {b"files": b'["file://a.parquet"]', b"receipts": b'{"r": 1}'})
    assert read.operation is Operation.APPEND and read.rows == 1


def test_changes_that_keep_failing_are_applied_alone_then_settled() -> None:
    failures = ChangeFailures(max_failures=3)
    for _ in range(2):
        failures.record_failure("demo/people", "5-0")
        assert not failures.applies_alone("demo/people", "5-0"), "fewer than max_failures: still with the others"
    failures.record_failure("demo/people", "5-0")
    assert failures.applies_alone("demo/people", "5-0") and not failures.applies_alone("demo/people", "6-0")
    assert not failures.applies_alone("demo/other", "5-0"), "per table"
    failures.record_settled("demo/people")
    assert not failures.applies_alone("demo/people", "5-0") and failures.failures == {}


def test_an_upkeep_run_keeps_its_facts_in_the_answer_the_api_gives() -> None:
    run = UpkeepRun(UpkeepOutcome.REQUESTED, request="q", facts={"requested_files": 4, "partitions": 2})
    assert run.to_dict() == {"outcome": "requested", "request": "q", "requested_files": 4, "partitions": 2}
    assert not run.settled
    read = UpkeepRun.from_json(b'{"outcome": "ok", "request": "q", "files_rewritten": 3, "seconds": 0.5, "at_ms": 7}')
    assert read.settled and read.facts == {"files_rewritten": 3} and read.to_dict()["seconds"] == 0.5
    failed = UpkeepRun.failed(ValueError("x" * 600), "q")
    assert failed.outcome is UpkeepOutcome.FAILED and len(failed.error) == 500
