"""Committer failover: no lost and no duplicated rows, against real Redis, Spark and Iceberg."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from service.api.waiter import ReceiptWaiter
from service.committer.leases import RENEW_SHARE, TableLease
from service.committer.loop import ACQUIRE_EVERY_S, Committer
from service.core import keys
from service.core.exceptions import LeadershipLost
from service.protocol.receipts import Receipt, parse_receipt
from tests.conftest import (
    Stack,
    all_committed,
    assert_exactly_once,
    post_batches,
    wait_until,
)
from tests.harness import move_first_entry_files_away, put_back

pytestmark = pytest.mark.spark


def pending_files(stack: Stack) -> int:
    return stack.redis.xlen(keys.commit_stream_key("demo", "logs"))


def test_committer_killed_and_restarted_loses_and_duplicates_nothing(stack: Stack) -> None:
    receipts = []
    for round_ in range(4):
        receipts += post_batches(stack, batches=5, per_batch=20, prefix=f"k{round_}")
        time.sleep(0.3 * round_)
        stack.kill("committer", signal.SIGKILL)
        receipts += post_batches(stack, batches=3, per_batch=20, prefix=f"k{round_}-down")
        stack.start("committer")
    wait_until(lambda: all_committed(stack, receipts), timeout_s=120, what="every receipt committed")
    assert_exactly_once(stack, expected=4 * 8 * 20)


def test_two_committers_never_commit_the_same_files(stack_factory) -> None:  # noqa: ANN001
    stack = stack_factory(roles=("api", "writer", "committer"))
    stack.start("committer", name="committer-2")
    receipts = []
    for round_ in range(6):
        receipts += post_batches(stack, batches=4, per_batch=25, prefix=f"two{round_}")
        if round_ == 3:
            # Kill whichever leads; the other must take the table over within the lease.
            stack.kill("committer", signal.SIGKILL)
        time.sleep(0.2)
    wait_until(lambda: all_committed(stack, receipts), timeout_s=120, what="every receipt committed")
    assert_exactly_once(stack, expected=6 * 4 * 25)
    table = stack.catalog().load_table(("demo", "logs"))
    fences = [int(s.summary.additional_properties[keys.SUMMARY_FENCE]) for s in table.snapshots()]
    assert fences == sorted(fences), "a snapshot carries an older fence than the one before it"


def test_an_idle_leader_commits_handed_off_files_before_its_interval_is_up(stack_factory) -> None:  # noqa: ANN001
    """The commit interval is the longest a hand-off waits, not the schedule: with an interval
    of a minute, requests one after another are each committed at the leader's next idle moment."""
    stack = stack_factory(CALVE_COMMIT_INTERVAL_S="60", CALVE_COMMIT_MIN_INTERVAL_S="0.2")
    with stack.client() as http:
        for number in range(3):  # the first commits at once (no commit before it), the others early
            answer = http.post("/logs?wait=true&timeout=40", json={"id": f"idle-{number}", "msg": "m"})
            assert answer.status_code == 200 and answer.json()["status"] == "committed", answer.text
    table = stack.catalog().load_table(("demo", "logs"))
    assert len(table.snapshots()) == 3
    assert_exactly_once(stack, expected=3)


def written_but_uncommitted(stack_factory, batches: int = 3):  # noqa: ANN001, ANN201
    """A stack with no committer, and files from `batches` requests waiting on the commit stream."""
    stack = stack_factory(roles=("api", "writer"))
    receipts = post_batches(stack, batches=batches, per_batch=10, prefix="pending")
    wait_until(lambda: all(
        stack.redis.hget(keys.receipt_key("demo", r), "status") == b"written" for r in receipts
    ), what="files written")
    return stack, receipts


def test_stale_leader_cannot_commit_after_losing_its_lease(stack_factory) -> None:  # noqa: ANN001
    stack, receipts = written_but_uncommitted(stack_factory)
    stale = Committer(stack.settings, stack.redis, stack.catalog(), name="stale")
    stale_lease = TableLease(stack.redis, "demo", "logs", "stale", lease_ms=60_000)
    assert stale_lease.acquire()
    table, plan = stale.commits.plan("demo", "logs")  # then it "pauses" past its lease...

    stack.redis.delete(stale_lease.key)  # ...the lease runs out, and a new leader commits
    fresh = Committer(stack.settings, stack.redis, stack.catalog(), name="fresh")
    fresh_lease = TableLease(stack.redis, "demo", "logs", "fresh", lease_ms=60_000)
    assert fresh_lease.acquire()
    assert fresh.commits.commit_table("demo", "logs", fresh_lease)
    assert fresh_lease.fence > stale_lease.fence

    with pytest.raises(LeadershipLost):
        stale.commits.apply("demo", "logs", table, plan, stale_lease)
    assert_exactly_once(stack, expected=30)


def test_stale_leader_past_its_lease_check_is_stopped_by_the_watermark(stack_factory, monkeypatch) -> None:  # noqa: ANN001
    # The lease check and the catalog call are two steps; a pause between them cannot be produced
    # on demand with real processes, so the stale leader's check is forced to pass here.
    stack, receipts = written_but_uncommitted(stack_factory)
    stale = Committer(stack.settings, stack.redis, stack.catalog(), name="stale")
    stale_lease = TableLease(stack.redis, "demo", "logs", "stale", lease_ms=60_000)
    assert stale_lease.acquire()
    table, plan = stale.commits.plan("demo", "logs")
    stack.redis.delete(stale_lease.key)

    fresh = Committer(stack.settings, stack.redis, stack.catalog(), name="fresh")
    fresh_lease = TableLease(stack.redis, "demo", "logs", "fresh", lease_ms=60_000)
    assert fresh_lease.acquire() and fresh.commits.commit_table("demo", "logs", fresh_lease)

    monkeypatch.setattr(stale_lease, "held", lambda: True)
    assert stale.commits.apply("demo", "logs", table, plan, stale_lease) is False
    assert_exactly_once(stack, expected=30)
    assert len(stack.catalog().load_table(("demo", "logs")).snapshots()) == 1


def test_a_waiting_request_is_answered_from_the_commit_announcement_without_reading_its_receipt(stack_factory) -> None:  # noqa: ANN001
    """The committer's announcement carries each settled receipt's fields. The waiter here follows
    the channel as a Redis user allowed nothing else: had it read the receipt again (HGETALL) it
    would be refused and wait out its timeout."""
    stack, receipts = written_but_uncommitted(stack_factory, batches=2)
    stack.redis.execute_command("ACL", "SETUSER", "listener", "reset", "on", "nopass", "&*", "+subscribe", "+unsubscribe", "+ping", "+client")
    committer = Committer(stack.settings, stack.redis, stack.catalog(), name="announcer")
    lease = TableLease(stack.redis, "demo", "logs", "announcer", lease_ms=60_000)
    assert lease.acquire()

    async def wait_and_commit() -> list[Receipt | None]:
        client = aioredis.Redis.from_url(stack.settings.redis_url, username="listener", password="any")
        waiter = ReceiptWaiter(client)
        await waiter.start()
        try:
            await asyncio.sleep(0.5)  # subscribed
            waits = [asyncio.create_task(waiter.wait("demo", receipt, timeout_s=20, fresh=True)) for receipt in receipts]
            await asyncio.sleep(0.1)
            assert await asyncio.to_thread(committer.commits.commit_table, "demo", "logs", lease)
            return await asyncio.wait_for(asyncio.gather(*waits), timeout=10)
        finally:
            await waiter.stop()
            await client.aclose()

    try:
        answers = asyncio.run(wait_and_commit())
    finally:
        stack.redis.execute_command("ACL", "DELUSER", "listener")
    snapshot = stack.catalog().load_table(("demo", "logs")).current_snapshot().snapshot_id
    for receipt, answer in zip(receipts, answers):
        assert answer is not None and answer.status == "committed", answer
        stored = parse_receipt(receipt, stack.redis.hgetall(keys.receipt_key("demo", receipt)))
        assert answer == stored
        assert answer.tables["logs"] == {"rows": 10, "snapshot_id": snapshot}


def test_crash_between_catalog_commit_and_acknowledgement_is_recovered(stack_factory, monkeypatch) -> None:  # noqa: ANN001
    # Dying at exactly that instant cannot be arranged with a real kill; the publisher raising
    # stands in for the process vanishing after the catalog accepted the commit.
    stack, receipts = written_but_uncommitted(stack_factory)
    first = Committer(stack.settings, stack.redis, stack.catalog(), name="first")
    lease = TableLease(stack.redis, "demo", "logs", "first", lease_ms=60_000)
    assert lease.acquire()

    def vanish(*_args, **_kwargs):  # noqa: ANN002, ANN003, ANN202
        raise SystemExit("committer died after the catalog commit")

    monkeypatch.setattr(first.publisher, "mark_committed", vanish)
    entries_before = pending_files(stack)
    assert entries_before >= 1
    with pytest.raises(SystemExit):
        first.commits.commit_table("demo", "logs", lease)
    assert pending_files(stack) == entries_before, "entries stay on the stream until acknowledged"
    assert all(stack.redis.hget(keys.receipt_key("demo", r), "status") == b"written" for r in receipts)
    lease.release()

    second = Committer(stack.settings, stack.redis, stack.catalog(), name="second")
    lease2 = TableLease(stack.redis, "demo", "logs", "second", lease_ms=60_000)
    assert lease2.acquire()
    assert second.commits.commit_table("demo", "logs", lease2) is False, "nothing new to commit"
    assert pending_files(stack) == 0
    snapshot_id = stack.catalog().load_table(("demo", "logs")).current_snapshot().snapshot_id
    for receipt in receipts:
        fields = stack.redis.hgetall(keys.receipt_key("demo", receipt))
        assert fields[b"status"] == b"committed"
        assert fields[b"committed:logs"] == f"{snapshot_id}:10".encode()
    assert_exactly_once(stack, expected=30)


def test_upkeep_bounds_snapshots_while_committers_are_killed_and_restarted(stack_factory) -> None:  # noqa: ANN001
    """The leader expires snapshots between its commits (here: every second, keeping three);
    committers killed and restarted meanwhile recover from the watermark exactly once, and the
    table's health shows the history bounded."""
    stack = stack_factory(
        CALVE_UPKEEP_INTERVAL_S="1", CALVE_SNAPSHOT_MAX_COUNT="3", CALVE_SNAPSHOT_MIN_COUNT="1",
    )
    receipts = []
    for round_ in range(4):
        receipts += post_batches(stack, batches=4, per_batch=10, prefix=f"u{round_}")
        time.sleep(1.5)
        stack.kill("committer", signal.SIGKILL)
        receipts += post_batches(stack, batches=2, per_batch=10, prefix=f"u{round_}-down")
        stack.start("committer")
    wait_until(lambda: all_committed(stack, receipts), timeout_s=120, what="every receipt committed")
    assert_exactly_once(stack, expected=4 * 6 * 10)
    with stack.client() as http:
        health = wait_until(
            lambda: (h := http.get("/v1/tables/logs").json()["health"])["snapshots"] <= 3 and "expire" in h["upkeep"] and h,
            timeout_s=30, what="an expiry recorded by the last leader",
        )
    assert health["upkeep"]["expire"]["outcome"] == "ok", health
    assert health["data_files"] >= 1 and health["manifests"] >= 1 and health["metadata_bytes"] > 0


def test_an_entry_whose_commit_can_never_succeed_is_parked_and_the_next_ones_commit(stack_factory, tmp_path) -> None:  # noqa: ANN001
    """A data file vanishes between the writer's hand-off and the commit (moved away here, as a
    lost disk or a wrong lifecycle rule would): the entry fails every commit, is parked with its
    reason, its receipt fails, and the table's later entries commit. Put back and retried, the
    rows are committed once."""
    stack = stack_factory(roles=("api", "writer"), CALVE_COMMIT_MAX_FAILURES="2")
    first = post_batches(stack, batches=1, per_batch=10, prefix="lost")
    wait_until(lambda: stack.redis.hget(keys.receipt_key("demo", first[0]), "status") == b"written", what="first written")
    later = post_batches(stack, batches=2, per_batch=10, prefix="later")
    wait_until(lambda: all(stack.redis.hget(keys.receipt_key("demo", r), "status") == b"written" for r in later), what="written")
    moved = move_first_entry_files_away(stack, "logs", tmp_path)

    stack.start("committer")
    with stack.client() as http:
        failed = wait_until(lambda: (r := http.get(f"/v1/receipts/{first[0]}").json())["status"] == "failed" and r, timeout_s=60, what="parked")
        wait_until(lambda: all_committed(stack, later), timeout_s=60, what="the later entries committed")
        assert "commit failed alone" in failed["error"]
        dead = http.get("/v1/tables/logs/dead-commits").json()["entries"]
        assert len(dead) == 1 and dead[0]["rows_by_receipt"] == {first[0]: 10}
        assert int(stack.redis.get(keys.backlog_key("demo"))) == 0, "a failed receipt leaves the backlog"
        assert sorted(row["id"].split("-")[0] for row in stack.rows()) == ["later"] * 20

        put_back(moved)
        assert http.post(f"/v1/tables/logs/dead-commits/{dead[0]['id']}/retry").status_code == 200
        wait_until(lambda: len(stack.rows()) == 30, timeout_s=60, what="the retried entry committed")
        assert http.get("/v1/tables/logs/dead-commits").json()["entries"] == []
        assert http.get(f"/v1/receipts/{first[0]}").json()["status"] == "failed", "its producer was told; it stays failed"
        assert http.delete(f"/v1/tables/logs/dead-commits/{dead[0]['id']}").status_code == 404
    assert_exactly_once(stack, expected=30)


def test_the_leader_removes_orphans_and_keeps_every_committed_row(stack_factory) -> None:  # noqa: ANN001
    stack = stack_factory(CALVE_ORPHAN_INTERVAL_S="1", CALVE_ORPHAN_MIN_AGE_S="3")
    receipts = post_batches(stack, batches=3, per_batch=10, prefix="o")
    wait_until(lambda: all_committed(stack, receipts), timeout_s=60, what="committed")
    data = Path(stack.catalog().load_table(("demo", "logs")).location().removeprefix("file://")) / "data"
    orphan = data / "batch-of-a-crashed-writer" / "part-00000.parquet"
    orphan.parent.mkdir()
    orphan.write_bytes(b"not committed")
    side_files = [path for path in data.rglob("*") if path.is_file() and not path.name.endswith(".parquet")]
    assert side_files, "Spark leaves _SUCCESS and .crc files beside the data"
    wait_until(lambda: not orphan.exists() and not any(path.exists() for path in side_files), timeout_s=30, what="orphans removed")
    with stack.client() as http:
        assert http.get("/v1/tables/logs").json()["health"]["upkeep"]["orphans"]["outcome"] == "ok"
    assert_exactly_once(stack, expected=30)


def test_a_committer_asks_redis_per_tick_not_per_idle_table(stack_factory) -> None:  # noqa: ANN001
    """Idle tables cost a tick no round trip each (at 300, they kept a committer at a fifth of a
    core): a lease taken or renewed lately is not renewed again until a fifth of it has passed,
    a table another committer leads is tried once a second, not every tick, and the lengths of
    the commit streams of the tables it leads come in one round trip. Leadership still moves: a lease left to expire is
    taken on the next try."""
    stack = stack_factory(roles=())
    members = [keys.member("demo", f"idle{i}") for i in range(40)]
    stack.redis.sadd(keys.TABLES, *members)
    other = TableLease(stack.redis, "demo", "idle0", "other", lease_ms=60_000)
    assert other.acquire()
    committer = Committer(stack.settings, stack.redis, stack.catalog(), name="ticking")
    stack.redis.config_resetstat()
    for _ in range(10):
        committer.tick()
    calls = {name.removeprefix("cmdstat_"): stats["calls"] for name, stats in stack.redis.info("commandstats").items()}
    assert calls["set"] == 40 and calls.get("evalsha", 0) == 0, calls  # each table tried once; none renewed yet
    assert calls["xlen"] == 9 * 39 and sorted(committer.leases) == sorted(members[1:])  # the tables it leads, from the tick after it took them
    stack.redis.delete(other.key)  # its leader gone: the lease runs out
    time.sleep(max(committer.settings.lease_s / RENEW_SHARE, ACQUIRE_EVERY_S) + 0.1)
    stack.redis.config_resetstat()
    committer.tick()
    calls = {name.removeprefix("cmdstat_"): stats["calls"] - stats.get("failed_calls", 0) for name, stats in stack.redis.info("commandstats").items()}
    assert calls["evalsha"] == 39 and members[0] in committer.leases, calls  # renewed once a fifth had passed; idle0 taken
    # (the renewals' first call may find the script not yet loaded: failed, loaded, sent again)
