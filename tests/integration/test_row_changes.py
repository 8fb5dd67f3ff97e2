"""Row-level changes copy-on-write, against real Redis, Spark Connect and Iceberg tables read back."""

from __future__ import annotations

import random
import signal
import threading
import time

import httpx
import orjson
import pyarrow.parquet as pq
import pytest
from pyiceberg.manifest import DataFileContent

from service.cli.processes import free_port
from service.core import keys
from service.iceberg.rewrites import live_data_files, live_files
from service.iceberg.watermark import ahead
from tests.conftest import Stack, wait_until
from tests.harness import duckdb_rows, move_first_entry_files_away, put_back

pytestmark = pytest.mark.spark

PEOPLE = {
    "name": "people", "source": {"http": {"path": "/people"}},
    "sinks": [{
        "table": "people", "auto_create": True, "operation": "op", "identifier_columns": ["id"],
        "schema": {"columns": [{"name": "id", "type": "long", "required": True}, {"name": "name", "type": "string"},
                               {"name": "n", "type": "long"}]},
    }],
}


def send(stack: Stack, events: list[dict], wait: bool = True) -> dict:
    with stack.client() as http:
        answer = http.post(f"/people?wait={str(wait).lower()}&timeout=120", content=b"\n".join(orjson.dumps(e) for e in events),
                           headers={"Content-Type": "application/x-ndjson"})
    assert answer.status_code == (200 if wait else 202), answer.text
    return answer.json()


def table_rows(stack: Stack) -> dict[int, dict]:
    table = stack.catalog().load_table(("demo", "people"))
    return {row["id"]: row for row in table.scan().to_arrow().to_pylist()}


def current_snapshot_id(stack: Stack) -> int:
    return stack.catalog().load_table(("demo", "people")).current_snapshot().snapshot_id


def no_delete_files(stack: Stack) -> None:
    table = stack.catalog().load_table(("demo", "people"))
    contents = table.inspect.files().column("content").to_pylist()
    assert set(contents) <= {0}, f"delete files were written: {contents}"


def people(write_mode: str | None) -> dict:
    """The people pipeline, its sink writing row changes in `write_mode` (None: the default, merge-on-read)."""
    if write_mode is None:
        return PEOPLE
    return {**PEOPLE, "sinks": [{**PEOPLE["sinks"][0], "write_mode": write_mode}]}


def delete_files_as_written(stack: Stack, write_mode: str) -> None:
    """Copy-on-write: no delete file. Merge-on-read: position delete files only, each naming one
    data file of the table, at most one per data file, DuckDB reads the rows pyiceberg reads (a local table), and the
    table's health counts them."""
    if write_mode == "copy-on-write":
        no_delete_files(stack)
        return
    table = stack.catalog().load_table(("demo", "people"))
    # A compaction asked for after the last run may fold every delete file: the files are those
    # the last change left (the newest snapshot that is not a compaction's replace).
    changed = table.current_snapshot()
    while changed.summary.operation.value == "replace" and changed.parent_snapshot_id is not None:
        changed = table.snapshot_by_id(changed.parent_snapshot_id)
    data, deletes = live_files(table, changed.snapshot_id)
    kinds = [delete.content for delete in deletes]
    assert kinds and set(kinds) == {DataFileContent.POSITION_DELETES}, f"position deletes only, some: {kinds}"
    named = []
    for delete in deletes:
        with table.io.new_input(delete.file_path).open() as stream:  # a local file or an object store's
            (referenced,) = set(pq.read_table(stream).column("file_path").to_pylist())
        assert referenced in data and delete.file_path.endswith(".parquet")
        named.append(referenced)
    assert len(named) == len(set(named)), "one delete file per data file: a change merges a file's earlier ones into its own"
    if table.location().startswith("file:"):  # DuckDB reaches an object store only through its httpfs extension (not here)
        assert {row["id"]: row for row in duckdb_rows(table)} == table_rows(stack), "DuckDB reads what pyiceberg reads"
    for log in stack.data_dir.glob("writer*.log"):  # the one-task way applied them: its fallback would hide its bugs
        assert b"one-task way could not apply" not in log.read_bytes(), log
    while True:  # a compaction asked for after the last run may commit between the listing and the health
        files = table.inspect.files()
        contents = files.column("content").to_pylist()
        with stack.client() as http:
            health = http.get("/v1/tables/people").json()["health"]
        now = stack.catalog().load_table(("demo", "people"))
        if now.current_snapshot().snapshot_id == table.current_snapshot().snapshot_id:
            break  # the health was of the snapshot listed
        table = now
    assert health["delete_files"] == contents.count(1)
    # (> 0 unless that compaction folded every delete file: the last change left some)
    assert health["deleted_rows"] == sum(row["record_count"] for row in files.to_pylist() if row["content"] == 1)
    assert health["deleted_rows"] > 0 or 1 not in contents


# Copy-on-write (not the default) in make test-long: 73 s of a make test worker, merge-on-read's 15.
@pytest.mark.parametrize("write_mode", [pytest.param("copy-on-write", marks=pytest.mark.long), "merge-on-read"])
def test_inserts_updates_and_deletes_apply_in_order_and_are_counted(stack: Stack, write_mode: str) -> None:
    with stack.client() as http:
        assert http.post("/v1/pipelines", json=people(write_mode)).status_code == 201
    first = send(stack, [{"op": "insert", "id": i, "name": f"p{i}", "n": 0} for i in range(10)])
    assert first["tables"]["people"]["changes"] == {"inserted": 10, "updated": 0, "deleted": 0, "noop": 0}, first
    # In one request: an update, a delete, an update of a missing key (a no-op), a key inserted,
    # updated, deleted and inserted again (the last state wins), an unknown operation (DLQ).
    second = send(stack, [
        {"op": "U", "id": 1, "name": "one", "n": 1},
        {"op": "d", "id": 2},
        {"op": "update", "id": 99, "name": "ghost", "n": 9},
        {"op": "c", "id": 20, "name": "a", "n": 1},
        {"op": "u", "id": 20, "name": "b", "n": 2},
        {"op": "DELETE", "id": 20},
        {"op": "i", "id": 20, "name": "c", "n": 3},
        {"op": "upsert", "id": 3},
        {"op": "insert", "name": "no key"},
    ])
    assert second["tables"]["people"]["changes"] == {"inserted": 2, "updated": 2, "deleted": 2, "noop": 1}, second
    assert second["dlq_events"] == 2
    rows = table_rows(stack)
    assert sorted(rows) == [0, 1, 3, 4, 5, 6, 7, 8, 9, 20]
    assert rows[1]["name"] == "one" and rows[20] == {"id": 20, "name": "c", "n": 3} and rows[3]["name"] == "p3"
    table = stack.catalog().load_table(("demo", "people"))
    assert table.schema().identifier_field_names() == {"id"}
    assert table.current_snapshot().summary.operation.value == "overwrite"
    assert table.properties["write.update.mode"] == write_mode
    delete_files_as_written(stack, write_mode)
    with stack.client() as http:
        reasons = sorted(e["reason"] for e in http.get("/v1/dlq").json()["entries"])
    assert reasons == ["missing identifier field 'id'", "operation 'upsert' is not insert, update or delete"]


def apply_model(model: dict[int, dict], event: dict, upsert: bool) -> None:
    key, op = event["id"], event["op"]
    if op == "d":
        model.pop(key, None)
    elif op == "i" or key in model or upsert:
        model[key] = {"id": key, "name": event.get("name"), "n": event.get("n")}


class FeedCopy:
    """A consumer of the people table's change feed on its own api replica, applying each change
    to a dict; at every cursor that ends a snapshot its copy must equal the table at that
    snapshot, and no change may be carryover (a row deleted and inserted unchanged by one
    snapshot). Its api is killed mid-run: it goes on from its last ack. A page whose ack may not
    have reached the api (the api died under it) is acked again before the next page is asked
    for, as a consumer that must not apply a change twice does: the api sends a page again until
    it is acked."""

    def __init__(self, stack: Stack, port: int) -> None:
        self.stack, self.port = stack, port
        self.copy: dict[int, dict] = {}
        self.by_snapshot: dict[int, list[dict]] = {}
        self.checked, self.problems, self.cursor = 0, [], ""
        self.unacked: str | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        catalog = self.stack.catalog()
        with self.stack.client(port=self.port) as http:
            while not self.stop.is_set():
                try:
                    self._page(http, catalog)
                except httpx.TransportError:
                    time.sleep(0.2)  # its api is down: the next page starts from the last ack

    def _page(self, http: httpx.Client, catalog) -> None:  # noqa: ANN001
        if self.unacked is not None:
            assert http.post("/v1/tables/people/consumers/copy/ack", json={"cursor": self.unacked}).status_code == 200
            self.unacked = None
        answer = http.get("/v1/tables/people/consumers/copy/changes", params={"limit": 40})
        if answer.status_code != 200:
            self.problems.append(answer.text)
            self.stop.set()
            return
        page = answer.json()
        for row in page["changes"]:
            plain = {"id": row["id"], "name": row["name"], "n": row["n"]}
            self.by_snapshot.setdefault(row["_snapshot_id"], []).append(row | {"plain": plain})
            if row["_change_type"] in ("INSERT", "UPDATE_AFTER"):
                self.copy[row["id"]] = plain
            elif self.copy.pop(row["id"], None) != plain:
                self.problems.append(f"a delete of a row the copy does not hold as it was: {row}")
        self.cursor = self.unacked = page["cursor"]
        assert http.post("/v1/tables/people/consumers/copy/ack", json={"cursor": page["cursor"]}).status_code == 200
        self.unacked = None
        if page["cursor"].count(":") == 1 and page["cursor"].startswith("snap:"):  # a snapshot's end
            snapshot_id = int(page["cursor"].split(":")[1])
            table = catalog.load_table(("demo", "people"))
            at = {row["id"]: row for row in table.scan(snapshot_id=snapshot_id).to_arrow().to_pylist()}
            if at != self.copy:
                self.problems.append(f"the copy differs from the table at snapshot {snapshot_id}")
            self.checked += 1
        if not page["more"]:
            time.sleep(0.3)

    def carryover(self) -> list[dict]:
        found = []
        for rows in self.by_snapshot.values():
            gone = [row["plain"] for row in rows if row["_change_type"] in ("DELETE", "UPDATE_BEFORE")]
            found += [row for row in rows if row["_change_type"] in ("INSERT", "UPDATE_AFTER") and row["plain"] in gone]
        return found


# Copy-on-write's run (the longest of make test: 2.5 min on a slow machine) is make test-long's; merge-on-read's make test's.
@pytest.mark.parametrize("write_mode", [pytest.param("copy-on-write", marks=pytest.mark.long), "merge-on-read"])
def test_random_changes_across_two_writers_and_a_killed_committer_end_as_the_model(stack_factory, write_mode: str) -> None:  # noqa: ANN001
    """Random inserts, updates and deletes over 200 keys in many requests, written by two writers,
    with the leader killed once mid-run and a compaction: the table ends as a model applying them
    in order, with delete files as the write mode says, and pyiceberg and DuckDB read one row per
    key; a change feed consumer that started with the table keeps a copy equal to it (FeedCopy),
    in both modes.

    Changes apply in hand-off order across requests (two writers may hand off requests sent a
    moment apart either way round), so requests in flight together touch different keys: each
    wave's requests split the keys between them, and a wave is sent once the last is handed off.
    Each wave appends rows of keys of their own too (an append pipeline into the same table),
    committed ahead of the changes queued before them when those are not in yet."""
    stack = stack_factory(CALVE_WRITER_BATCH_WAIT_S="0.3")
    stack.start("writer", name="writer-2")
    with stack.client() as http:
        assert http.post("/v1/pipelines", json=people(write_mode)).status_code == 201
    rng = random.Random(20261122)
    model: dict[int, dict] = {}
    receipts = []
    feed_port = free_port()
    stack.start("api", name="api-2", port=feed_port)
    feed = FeedCopy(stack, feed_port)
    with stack.client() as http:
        for wave in range(12):
            if wave == 1:
                answer = http.post("/v1/tables/people/consumers", json={"name": "copy", "start": "earliest", "initial_load": True})
                assert answer.status_code == 201, answer.text
                feed.thread.start()
                log = {"name": "people_log", "source": {"http": {"path": "/people_log"}}, "sinks": [{"table": "people"}]}  # the table is there now
                assert http.post("/v1/pipelines", json=log).status_code == 201
            if wave == 4:
                stack.kill("api-2", signal.SIGKILL)
                stack.start("api", name="api-2", port=feed_port)
            if wave == 8:
                assert http.post("/v1/tables/people/maintenance", json={"tasks": ["compact", "expire"], "wait_s": 5}).status_code in (200, 202)
            sent = []
            for part in range(3):
                events = []
                for _ in range(rng.randint(5, 40)):
                    key = rng.randrange(67) * 3 + part
                    op = rng.choices(["i", "u", "d"], weights=[5, 3, 2])[0]
                    event = {"op": op, "id": key} if op == "d" else {"op": op, "id": key, "name": f"w{wave}", "n": rng.randrange(1000)}
                    events.append(event)
                    apply_model(model, event, upsert=False)
                sent.append(send(stack, events, wait=False)["receipt"])
            if wave:
                appended = [{"id": 1000 + wave * 3 + i, "name": f"log{wave}", "n": i} for i in range(3)]
                answer = http.post("/people_log", content=b"\n".join(orjson.dumps(row) for row in appended),
                                   headers={"Content-Type": "application/x-ndjson"})
                assert answer.status_code == 202, answer.text
                sent.append(answer.json()["receipt"])
                model.update({row["id"]: row for row in appended})
            wait_until(lambda: all(http.get(f"/v1/receipts/{r}").json()["status"] in ("written", "committed") for r in sent),
                       timeout_s=60, what="the wave handed off")
            receipts += sent
            if wave == 6:
                stack.kill("committer", signal.SIGKILL)
                time.sleep(0.5)
                stack.start("committer")
        wait_until(lambda: all(http.get(f"/v1/receipts/{r}").json()["status"] == "committed" for r in receipts),
                   timeout_s=180, what="every request committed")
    assert table_rows(stack) == model
    table = stack.catalog().load_table(("demo", "people"))
    assert {row["id"]: row for row in duckdb_rows(table)} == model, "DuckDB reads what pyiceberg reads"
    # A compaction asked for after the last run may commit after this: the feed catches up with
    # the table as it is now, not as it was loaded above.
    wait_until(lambda: feed.cursor == f"snap:{current_snapshot_id(stack)}" or feed.problems, timeout_s=90, what="the feed caught up")
    feed.stop.set()
    feed.thread.join(30)
    assert not feed.problems, feed.problems[:3]
    assert feed.copy == model, "the consumer's copy ends equal to the table"
    assert feed.checked >= 5, "the copy was compared at snapshot ends along the way"
    assert feed.carryover() == []
    delete_files_as_written(stack, write_mode)
    assert not stack.redis.exists(keys.applying_key("demo", "people"))
    table = stack.catalog().load_table(("demo", "people"))
    assert all("changes-" not in path for path in live_data_files(table)), "change files are never data files"


def leader_here(stack_factory, **overrides: str):  # noqa: ANN001, ANN201 - (Stack, Committer, TableLease)
    """A stack of an api and a writer with the `people` pipeline, and the table's leader in this
    process (its commit rounds run one at a time, by the test)."""
    from service.committer.leases import TableLease
    from service.committer.loop import Committer

    stack = stack_factory(roles=("api", "writer"), **overrides)
    with stack.client() as http:
        assert http.post("/v1/pipelines", json=PEOPLE).status_code == 201
    leader = Committer(stack.settings, stack.redis, stack.catalog(), name="leader")
    lease = TableLease(stack.redis, "demo", "people", "leader", lease_ms=120_000)
    assert lease.acquire()
    return stack, leader, lease


def status(stack: Stack, receipt: str) -> bytes | None:
    return stack.redis.hget(keys.receipt_key("demo", receipt), "status")


def first_change_applied(stack: Stack, leader, lease) -> str:  # noqa: ANN001
    """A change handed off, asked for by the leader and applied (not committed): its receipt."""
    first = send(stack, [{"op": "i", "id": 1, "name": "a", "n": 1}], wait=False)["receipt"]
    wait_until(lambda: status(stack, first) == b"written", what="the first change handed off")
    assert leader.commits.commit_table("demo", "people", lease) is False, "the change is asked for, not committed yet"
    wait_until(lambda: stack.redis.hexists(keys.applying_key("demo", "people"), "result"), what="the first change applied")
    return first


def second_change(stack: Stack) -> str:
    second = send(stack, [{"op": "u", "id": 1, "name": "b", "n": 2}], wait=False)["receipt"]
    wait_until(lambda: status(stack, second) == b"written", what="the second change handed off")
    return second


def append_one(stack: Stack) -> str:
    """A row appended to `people` through an append pipeline, handed off: its receipt."""
    log = {"name": "people_log", "source": {"http": {"path": "/people_log"}}, "sinks": [{"table": "people"}]}
    with stack.client() as http:
        assert http.post("/v1/pipelines", json=log).status_code == 201
        answer = http.post("/people_log", content=orjson.dumps({"id": 50, "name": "appended", "n": 0}),
                           headers={"Content-Type": "application/x-ndjson"})
    assert answer.status_code == 202, answer.text
    appended = answer.json()["receipt"]
    wait_until(lambda: status(stack, appended) == b"written", what="the append handed off")
    return appended


def test_entries_queued_behind_changes_never_commit_past_changes_not_yet_applied(stack_factory) -> None:  # noqa: ANN001
    """A change run answers for the entries queued when it was asked; a change queued after the
    ask waits for the next run, and an append to the same table queued after that commits ahead of
    it: the append's commit must not carry the table's watermark past the second change (which
    would then never be applied)."""
    stack, leader, lease = leader_here(stack_factory)
    first = first_change_applied(stack, leader, lease)
    second = second_change(stack)
    appended = append_one(stack)

    def committed() -> bool:
        leader.commits.commit_table("demo", "people", lease)
        return all(status(stack, r) == b"committed" for r in (first, second, appended))

    wait_until(committed, timeout_s=90, interval_s=0.2, what="every request committed, the second change included")
    rows = table_rows(stack)
    assert rows[1]["name"] == "b" and rows[50]["name"] == "appended", rows


def test_a_committed_run_asks_for_a_compaction_once_small_files_pile_up(stack_factory) -> None:  # noqa: ANN001
    """Each run adds a small file that the next runs look in; a run's commit asks for a
    compaction where they piled up, without waiting for the scheduled upkeep (an hour away here)."""
    stack, leader, lease = leader_here(stack_factory, CALVE_COMPACT_MIN_FILES="2", CALVE_UPKEEP_INTERVAL_S="3600")
    member, compacting = keys.member("demo", "people"), keys.compacting_key("demo", "people")

    def run(row: dict) -> None:
        receipt = send(stack, [row], wait=False)["receipt"]
        wait_until(lambda: status(stack, receipt) == b"written", what="the change handed off")

        def committed() -> bool:
            leader.commit(member, lease, time.monotonic())
            return status(stack, receipt) == b"committed"

        wait_until(committed, timeout_s=90, interval_s=0.2, what="the change's run committed")

    run({"op": "i", "id": 1, "name": "a", "n": 1})
    assert not stack.redis.exists(compacting), "one data file: nothing to merge"
    run({"op": "i", "id": 2, "name": "b", "n": 2})
    assert stack.redis.exists(compacting), "two small files after the second run: a compaction is asked for"

    # A compaction asked for by hand meanwhile is not answered "busy": it waits for this one, then runs.
    with stack.client() as http:
        asked = http.post("/v1/tables/people/maintenance", json={"tasks": ["compact"], "wait_s": 0.2})
    assert asked.status_code == 202, asked.text
    leader.upkeep.maintain("demo", "people", lease)
    assert stack.redis.hexists(keys.maintenance_key("demo", "people"), "compact"), "still asked for"
    last = orjson.loads(stack.redis.hget(keys.upkeep_key("demo", "people"), "compact") or b"{}")
    assert last.get("request") != asked.json()["request"], f"not answered yet (not busy): {last}"

    def compacted() -> bool:
        leader.commits.commit_table("demo", "people", lease)
        return not stack.redis.exists(compacting)

    wait_until(compacted, timeout_s=120, interval_s=0.5, what="the compaction committed")
    leader.upkeep.maintain("demo", "people", lease)
    record = orjson.loads(stack.redis.hget(keys.upkeep_key("demo", "people"), "compact"))
    assert record["request"] == asked.json()["request"] and record["outcome"] in ("ok", "requested"), record
    assert len(live_data_files(stack.catalog().load_table(("demo", "people")))) == 1
    rows = table_rows(stack)
    assert rows[1]["name"] == "a" and rows[2]["name"] == "b", rows


def people_rows(stack: Stack) -> list[tuple[int, str]]:
    table = stack.catalog().load_table(("demo", "people"))
    return sorted((row["id"], row["name"]) for row in table.scan().to_arrow().to_pylist())


def test_an_append_queued_behind_changes_commits_ahead_of_them_and_they_never_touch_its_rows(stack_factory) -> None:  # noqa: ANN001
    """An append queued behind row changes not committed yet commits ahead of them. It came after
    them: their run, asked for after it is in the table, does not see its rows, even of a key they
    change (here both insert key 50: the table ends with both rows, as in the order they were
    sent). The table's watermark then moves over the append."""
    stack, leader, lease = leader_here(stack_factory)
    first = first_change_applied(stack, leader, lease)
    second = send(stack, [{"op": "i", "id": 50, "name": "changed", "n": 1}], wait=False)["receipt"]
    wait_until(lambda: status(stack, second) == b"written", what="the second change handed off")
    appended = append_one(stack)
    assert leader.commits.append_waiting("demo", "people"), "the tick sees an append waiting behind the changes"
    assert leader.commits.commit_table("demo", "people", lease, run_due=False) is True
    assert status(stack, first) == status(stack, appended) == b"committed", "the first run, and the append ahead of the second"
    assert status(stack, second) == b"written"
    assert not leader.commits.append_waiting("demo", "people"), "nothing new to commit ahead"
    assert people_rows(stack) == [(1, "a"), (50, "appended")]

    def committed() -> bool:
        leader.commits.commit_table("demo", "people", lease, run_due=True)
        return status(stack, second) == b"committed"

    wait_until(committed, timeout_s=90, interval_s=0.2, what="the second change committed")
    assert people_rows(stack) == [(1, "a"), (50, "appended"), (50, "changed")]
    table = stack.catalog().load_table(("demo", "people"))
    assert ahead(table) == () and not stack.redis.xlen(keys.commit_stream_key("demo", "people")), "the watermark moved over the append"


def test_changes_applied_before_an_append_committed_ahead_of_them_commit_without_being_applied_again(stack_factory) -> None:  # noqa: ANN001
    """Changes whose run is not due yet, and an append queued behind them: their run is asked for
    at once, and the append commits ahead of them while the writer applies it. The answer,
    computed against the snapshot before the append, is committed as it is (only an append ahead
    of it followed that snapshot), not applied again."""
    from service.core import metrics

    stack, leader, lease = leader_here(stack_factory)
    change = send(stack, [{"op": "i", "id": 1, "name": "a", "n": 1}], wait=False)["receipt"]
    wait_until(lambda: status(stack, change) == b"written", what="the change handed off")
    appended = append_one(stack)
    writer = stack.procs["writer"]
    writer.send_signal(signal.SIGSTOP)
    try:
        before = stack.catalog().load_table(("demo", "people")).metadata.current_snapshot_id  # None: the table is empty yet
        assert leader.commits.commit_table("demo", "people", lease, run_due=False) is True, "the append committed ahead"
        asked = orjson.loads(stack.redis.hget(keys.applying_key("demo", "people"), "request"))
        assert asked["base_snapshot"] == before and status(stack, appended) == b"committed" and status(stack, change) == b"written"
    finally:
        writer.send_signal(signal.SIGCONT)
    reapplied = metrics.CHANGES_REAPPLIED.labels("demo", "people")._value.get()

    def committed() -> bool:
        leader.commits.commit_table("demo", "people", lease)
        return status(stack, change) == b"committed"

    wait_until(committed, timeout_s=90, interval_s=0.2, what="the change committed")
    assert metrics.CHANGES_REAPPLIED.labels("demo", "people")._value.get() == reapplied, "committed as applied, not applied again"
    assert people_rows(stack) == [(1, "a"), (50, "appended")]


def test_a_leader_that_died_after_committing_ahead_leaves_it_to_the_next_to_announce_never_to_commit_again(stack_factory) -> None:  # noqa: ANN001
    """A leader commits an append ahead of changes, then dies before publishing its receipts (a
    fake: the receipts are dropped, as a killed process cannot be resumed here). The next leader
    reads the entries beyond the watermark from the snapshot: it announces the append, commits
    nothing twice, and the changes commit after it."""
    from service.committer.loop import Committer

    stack, leader, lease = leader_here(stack_factory)
    change = send(stack, [{"op": "i", "id": 1, "name": "a", "n": 1}], wait=False)["receipt"]
    wait_until(lambda: status(stack, change) == b"written", what="the change handed off")
    appended = append_one(stack)
    leader.commits.publisher.mark_committed = lambda *args, **kwargs: []  # dies before acknowledging
    assert leader.commits.commit_table("demo", "people", lease, run_due=False) is True
    assert status(stack, appended) == b"written"
    snapshots = len(stack.catalog().load_table(("demo", "people")).snapshots())

    successor = Committer(stack.settings, stack.redis, stack.catalog(), name="leader")
    assert successor.commits.commit_table("demo", "people", lease, run_due=False) is False, "nothing is committed again"
    assert status(stack, appended) == b"committed", "the successor announced the append"
    assert len(stack.catalog().load_table(("demo", "people")).snapshots()) == snapshots

    def committed() -> bool:
        successor.commits.commit_table("demo", "people", lease, run_due=True)
        return status(stack, change) == b"committed"

    wait_until(committed, timeout_s=90, interval_s=0.2, what="the changes committed")
    assert people_rows(stack) == [(1, "a"), (50, "appended")]


def test_an_append_behind_a_run_commits_with_it_and_the_next_run_waits_for_its_schedule(stack_factory) -> None:  # noqa: ANN001
    """Appends to a table taking row changes do not wait for the changes' schedule: an append
    queued behind a run is committed in the round that commits the run, and the next run of
    changes (queued behind the append) is asked for only once it is due."""
    stack, leader, lease = leader_here(stack_factory)
    first = first_change_applied(stack, leader, lease)
    appended = append_one(stack)
    second = second_change(stack)

    assert leader.commits.commit_table("demo", "people", lease, run_due=False) is True
    assert status(stack, first) == status(stack, appended) == b"committed", "the append behind the run is committed in the same round"
    assert status(stack, second) == b"written" and not stack.redis.exists(keys.applying_key("demo", "people")), (
        "the next run is not asked for yet")
    assert keys.member("demo", "people") in leader.commits.waiting_for_run, "the leader looks again only once the run is due"

    def committed() -> bool:
        leader.commits.commit_table("demo", "people", lease, run_due=True)
        return status(stack, second) == b"committed"

    wait_until(committed, timeout_s=90, interval_s=0.2, what="the second change committed once its run is due")
    rows = table_rows(stack)
    assert rows[1]["name"] == "b" and rows[50]["name"] == "appended", rows


def test_changes_applied_to_a_table_that_moved_meanwhile_are_applied_again(stack_factory) -> None:  # noqa: ANN001
    """A compaction by another engine rewrites the table's files while a writer applies a change
    against the snapshot before it: the answer is not committed over the compaction; the change
    is applied again to the table as it now is, and nothing is lost or brought back."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from service.iceberg.rewrites import replace_files

    stack = stack_factory()
    with stack.client() as http:
        assert http.post("/v1/pipelines", json=PEOPLE).status_code == 201
    for part in range(3):
        send(stack, [{"op": "i", "id": part * 10 + i, "name": "old", "n": i} for i in range(10)])
    stack.kill("committer", signal.SIGTERM)
    change = send(stack, [{"op": "u", "id": 5, "name": "new", "n": 50}, {"op": "d", "id": 15}], wait=False)["receipt"]
    wait_until(lambda: stack.redis.hget(keys.receipt_key("demo", change), "status") == b"written", what="the change handed off")
    writer = stack.procs["writer"]
    writer.send_signal(signal.SIGSTOP)
    try:
        stack.start("committer")
        wait_until(lambda: stack.redis.hexists(keys.applying_key("demo", "people"), "request"), what="the leader asked for the change")
        # Meanwhile another engine compacts the table: the three files become one.
        table = stack.catalog().load_table(("demo", "people"))
        small = sorted(live_data_files(table))
        merged = small[0].rsplit("/", 2)[0] + "/other-engine-compaction.parquet"
        pq.write_table(pa.concat_tables([pq.read_table(path.removeprefix("file://")) for path in small]), merged.removeprefix("file://"))
        with table.transaction() as transaction:
            replace_files(table, transaction, small, [merged], {})
    finally:
        writer.send_signal(signal.SIGCONT)
    with stack.client() as http:
        wait_until(lambda: http.get(f"/v1/receipts/{change}").json()["status"] == "committed", timeout_s=90, what="the change committed")
        answer = http.get(f"/v1/receipts/{change}").json()
    assert answer["tables"]["people"]["changes"] == {"inserted": 0, "updated": 1, "deleted": 1, "noop": 0}, answer
    rows = table_rows(stack)
    assert sorted(rows) == [i for i in range(30) if i != 15]
    assert rows[5] == {"id": 5, "name": "new", "n": 50} and all(rows[i]["name"] == "old" for i in rows if i != 5)
    assert b"applying them again" in (stack.data_dir / "committer.log").read_bytes()
    delete_files_as_written(stack, "merge-on-read")  # the default


@pytest.mark.parametrize("write_mode", [pytest.param("copy-on-write", marks=pytest.mark.long), "merge-on-read"])
def test_a_compaction_and_a_row_change_of_the_same_files_never_commit_one_over_the_other(stack_factory, write_mode: str) -> None:  # noqa: ANN001
    """A compaction of the table's files and row changes touching them race through the commit
    stream: whichever comes second finds its files replaced or rows of them deleted (the
    compaction is dropped) or is applied to the compacted table (the changes); no row is lost,
    doubled or brought back."""
    import uuid

    from service.protocol.compaction import CompactionRequest

    stack = stack_factory(CALVE_UPKEEP_INTERVAL_S="3600")
    with stack.client() as http:
        assert http.post("/v1/pipelines", json=people(write_mode)).status_code == 201
    model: dict[int, dict] = {}
    for part in range(4):
        events = [{"op": "i", "id": part * 10 + i, "name": "old", "n": i} for i in range(10)]
        send(stack, events)
        for event in events:
            apply_model(model, event, upsert=False)
    files = sorted(live_data_files(stack.catalog().load_table(("demo", "people"))))
    request = CompactionRequest("demo", "people", uuid.uuid4().hex, [(files, 1)])
    stack.redis.set(keys.compacting_key("demo", "people"), request.request)
    stack.redis.rpush(keys.COMPACTIONS, request.to_json())
    receipts = []
    for round_ in range(3):
        events = [{"op": "u", "id": round_ * 10 + 1, "name": f"new{round_}", "n": 100}, {"op": "d", "id": round_ * 10 + 2}]
        receipts.append(send(stack, events, wait=False)["receipt"])
        for event in events:
            apply_model(model, event, upsert=False)
    with stack.client() as http:
        wait_until(lambda: all(http.get(f"/v1/receipts/{r}").json()["status"] == "committed" for r in receipts),
                   timeout_s=120, what="the changes committed")
        wait_until(lambda: stack.redis.llen(keys.COMPACTIONS) == 0 and not stack.redis.exists(keys.compacting_key("demo", "people")),
                   timeout_s=120, what="the compaction settled")
        outcome = http.get("/v1/tables/people").json()["health"]["upkeep"]["compact"]["outcome"]
    assert outcome in ("ok", "dropped"), outcome
    assert table_rows(stack) == model
    table = stack.catalog().load_table(("demo", "people"))
    assert {row["id"]: row for row in duckdb_rows(table)} == model
    delete_files_as_written(stack, write_mode)
    # A compaction asked for by hand folds every delete file in: the rows stay, the delete files go.
    with stack.client() as http:
        answer = http.post("/v1/tables/people/maintenance", json={"tasks": ["compact"], "wait_s": 120})
        assert answer.status_code == 200, answer.text
        compact = answer.json()["tasks"]["compact"]
        health = http.get("/v1/tables/people").json()["health"]
    assert compact["outcome"] == "ok", compact
    assert (health["data_files"], health["delete_files"], health["deleted_rows"]) == (1, 0, 0), health
    assert table_rows(stack) == model
    table = stack.catalog().load_table(("demo", "people"))
    assert {row["id"]: row for row in duckdb_rows(table)} == model


def test_a_pipeline_fed_by_a_table_keeps_a_copy_equal_to_it(stack: Stack) -> None:
    """A pipeline whose source is the people table's change feed, through a processor into a
    table of its own: inserts, updates and deletes of the source all reach the copy; the feed's
    columns and the operation do not become columns of it."""
    with stack.client() as http:
        assert http.post("/v1/pipelines", json=PEOPLE).status_code == 201
    send(stack, [{"op": "i", "id": i, "name": f"p{i}", "n": i} for i in range(20)])
    copy = {
        "name": "people_copy", "source": {"table": "people"},
        "processors": [{"where": "n < 1000"}],
        "sinks": [{"table": "people_copy", "auto_create": True, "identifier_columns": ["id"]}],
    }
    with stack.client() as http:
        answer = http.post("/v1/pipelines", json=copy)
        assert answer.status_code == 201, answer.text
        bad = http.post("/v1/pipelines", json=copy | {"name": "loop", "sinks": [{"table": "people", "auto_create": True}]})
        assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "sinks[0].table"
        missing = http.post("/v1/pipelines", json=copy | {"name": "nothing", "source": {"table": "nope"}})
        assert missing.status_code == 422 and missing.json()["errors"][0]["field"] == "source.table"

    def copied() -> dict[int, dict]:
        table = stack.catalog().load_table(("demo", "people_copy")) if stack.catalog().table_exists(("demo", "people_copy")) else None
        return {row["id"]: row for row in table.scan().to_arrow().to_pylist()} if table is not None else {}

    wait_until(lambda: copied() == table_rows(stack), timeout_s=90, what="the initial load copied")
    send(stack, [{"op": "u", "id": 3, "name": "three", "n": 3}, {"op": "d", "id": 4}, {"op": "i", "id": 30, "name": "new", "n": 30}])
    send(stack, [{"op": "d", "id": 5}, {"op": "u", "id": 30, "name": "newer", "n": 31}])
    wait_until(lambda: copied() == table_rows(stack), timeout_s=90, what="the changes copied")
    rows = copied()
    assert rows[3]["name"] == "three" and 4 not in rows and 5 not in rows and rows[30]["name"] == "newer"
    table = stack.catalog().load_table(("demo", "people_copy"))
    assert set(table.schema().column_names) == {"id", "name", "n"}
    assert table.schema().identifier_field_names() == {"id"}
    with stack.client() as http:
        consumers = http.get("/v1/tables/people/consumers").json()["consumers"]
        assert [c["name"] for c in consumers] == ["pipeline:people_copy"] and consumers[0]["phase"] == "changes"
        assert http.delete("/v1/pipelines/people_copy").status_code == 200
        assert http.get("/v1/tables/people/consumers").json()["consumers"] == [], "a deleted pipeline holds no snapshots"


def test_changes_that_cannot_apply_are_parked_alone_and_the_next_ones_apply(stack_factory, tmp_path) -> None:  # noqa: ANN001
    """A changes entry whose files vanished before it was applied (moved away here) fails every
    application with the entries after it; asked alone it fails again and is parked with its
    reason (its receipt fails), and the next changes apply. Put back and retried, it applies."""
    stack = stack_factory(roles=("api", "writer"), CALVE_COMMIT_MAX_FAILURES="2")
    with stack.client() as http:
        assert http.post("/v1/pipelines", json=PEOPLE).status_code == 201
    bad = send(stack, [{"op": "i", "id": 1, "name": "lost", "n": 1}], wait=False)["receipt"]
    wait_until(lambda: stack.redis.hget(keys.receipt_key("demo", bad), "status") == b"written", what="the first change written")
    good = send(stack, [{"op": "i", "id": 2, "name": "kept", "n": 2}], wait=False)["receipt"]
    wait_until(lambda: stack.redis.hget(keys.receipt_key("demo", good), "status") == b"written", what="the second change written")
    moved = move_first_entry_files_away(stack, "people", tmp_path)

    stack.start("committer")
    with stack.client() as http:
        failed = wait_until(lambda: (r := http.get(f"/v1/receipts/{bad}").json())["status"] == "failed" and r, timeout_s=90, what="parked")
        assert "failed to apply on their own" in failed["error"]
        wait_until(lambda: http.get(f"/v1/receipts/{good}").json()["status"] == "committed", timeout_s=60, what="the next change applied")
        assert table_rows(stack) == {2: {"id": 2, "name": "kept", "n": 2}}
        dead = http.get("/v1/tables/people/dead-commits").json()["entries"]
        assert len(dead) == 1 and dead[0]["rows_by_receipt"] == {bad: 1}
        put_back(moved)
        assert http.post(f"/v1/tables/people/dead-commits/{dead[0]['id']}/retry").status_code == 200
        wait_until(lambda: 1 in table_rows(stack), timeout_s=60, what="the retried change applied")
    assert table_rows(stack) == {1: {"id": 1, "name": "lost", "n": 1}, 2: {"id": 2, "name": "kept", "n": 2}}
    no_delete_files(stack)
