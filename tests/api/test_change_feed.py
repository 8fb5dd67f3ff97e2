"""The change feed over real Iceberg tables written here with pyiceberg (no Spark needed):
changes between snapshots, carryover removal, update pairing, compactions, schema evolution,
merge-on-read position deletes read as deletes, equality delete files refused; consumers with an initial load, pages, acks, and snapshot expiry that keeps
what they have not read."""

from __future__ import annotations

import uuid

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestWriterV2,
)
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation
from pyiceberg.table.update.snapshot import _FastAppendFiles
from pyiceberg.typedef import Record
from pyiceberg.types import LongType, NestedField, StringType
from sqlmodel import Session

from service.core.db import get_engine
from service.feeds.consumers import protected_snapshots
from service.iceberg.catalog import open_catalog
from service.iceberg.rewrites import live_data_files, live_files, overwrite_files, referenced_data_file, replace_files, row_delta
from service.iceberg.upkeep import ExpiryPolicy, expire_snapshots

ARROW = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string())])


@pytest.fixture(scope="module")
def catalog(app_client) -> Catalog:  # noqa: ANN001
    return open_catalog(app_client.app.state.settings)


def new_table(catalog: Catalog, identifier: bool = True) -> tuple[str, Table]:
    name = f"t_{uuid.uuid4().hex[:8]}"
    schema = Schema(
        NestedField(1, "id", LongType(), required=True), NestedField(2, "name", StringType()),
        identifier_field_ids=[1] if identifier else [],
    )
    catalog.create_namespace_if_not_exists("demo")
    return name, catalog.create_table(("demo", name), schema)


def rows(*pairs: tuple[int, str]) -> pa.Table:
    return pa.Table.from_pylist([{"id": i, "name": n} for i, n in pairs], schema=ARROW)


def parquet(table: Table, data: pa.Table) -> str:
    """A data file of `data` in the table's storage (through its FileIO: local or an object store)."""
    path = f"{table.location()}/data/test-{uuid.uuid4().hex}.parquet"
    with table.io.new_output(path).create() as stream:
        pq.write_table(data, stream)
    return path


def rewrite(catalog: Catalog, table: Table, data: pa.Table, replace: bool = False) -> Table:
    """One snapshot swapping every live file for one holding `data`: what a copy-on-write change
    of a few rows (or, with `replace`, a compaction) commits."""
    table = catalog.load_table(table.name())
    transaction = table.transaction()
    swap = replace_files if replace else overwrite_files
    swap(table, transaction, sorted(live_data_files(table)), [parquet(table, data)], {})
    transaction.commit_transaction()
    return catalog.load_table(table.name())


def changes(app_client, name: str, **params: int) -> list[dict]:  # noqa: ANN001
    answer = app_client.get(f"/v1/tables/{name}/changes", params=params)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("application/x-ndjson")
    return [orjson.loads(line) for line in answer.text.splitlines()]


def brief(change_rows: list[dict]) -> list[tuple]:
    return [(row["_change_type"], row["id"], row["name"]) for row in change_rows]


def test_a_rewrite_emits_only_the_changed_rows_and_pairs_updates_by_identifier(app_client, catalog: Catalog) -> None:  # noqa: ANN001
    name, table = new_table(catalog)
    table.append(rows((1, "a"), (2, "b"), (3, "c"), (4, "d"), (5, "e")))
    first = table.current_snapshot().snapshot_id
    table = rewrite(catalog, table, rows((1, "a"), (2, "B"), (3, "c"), (5, "e"), (6, "f")))
    second = table.current_snapshot()

    got = changes(app_client, name, from_snapshot=first)
    assert brief(got) == [("UPDATE_BEFORE", 2, "b"), ("DELETE", 4, "d"), ("UPDATE_AFTER", 2, "B"), ("INSERT", 6, "f")]
    assert {row["_snapshot_id"] for row in got} == {second.snapshot_id}
    assert [row["_document_id"] for row in got] == ["2", "4", "2", "6"]
    assert all(row["_committed_at"].endswith("Z") for row in got)
    everything = changes(app_client, name)
    assert brief(everything)[:5] == [("INSERT", i, n) for i, n in zip(range(1, 6), "abcde", strict=True)]
    assert everything[5:] == got, "the same changes, whatever the range they are read in"
    assert changes(app_client, name, from_snapshot=first, to_snapshot=first) == []


def test_without_identifier_columns_changes_are_deletes_and_inserts_counted_as_a_multiset(app_client, catalog: Catalog) -> None:  # noqa: ANN001
    name, table = new_table(catalog, identifier=False)
    table.append(rows((1, "a"), (1, "a"), (2, "b")))
    first = table.current_snapshot().snapshot_id
    rewrite(catalog, table, rows((1, "a"), (2, "B")))
    assert brief(changes(app_client, name, from_snapshot=first)) == [("DELETE", 1, "a"), ("DELETE", 2, "b"), ("INSERT", 2, "B")]
    assert "_document_id" not in changes(app_client, name)[0]


def test_compactions_emit_nothing_and_old_files_read_with_the_current_schema(app_client, catalog: Catalog) -> None:  # noqa: ANN001
    name, table = new_table(catalog)
    table.append(rows((1, "a")))
    table.append(rows((2, "b")))
    before = catalog.load_table(table.name()).current_snapshot().snapshot_id
    table = rewrite(catalog, table, rows((1, "a"), (2, "b")), replace=True)
    assert table.current_snapshot().summary.operation.value == "replace"
    assert changes(app_client, name, from_snapshot=before) == []
    with table.update_schema() as update:
        update.add_column("extra", StringType())
    table = catalog.load_table(table.name())
    table.append(pa.Table.from_pylist([{"id": 3, "name": "c", "extra": "x"}], schema=table.schema().as_arrow()))
    got = changes(app_client, name)
    assert [(row["id"], row["extra"]) for row in got] == [(1, None), (2, None), (3, "x")]


def test_bad_ranges_are_refused_with_what_to_do(app_client, catalog: Catalog) -> None:  # noqa: ANN001
    name, table = new_table(catalog)
    table.append(rows((1, "a")))
    first = table.current_snapshot().snapshot_id
    table.append(rows((2, "b")))
    second = catalog.load_table(table.name()).current_snapshot().snapshot_id
    # Never one of the table's (its history is whole, or the id is not one Iceberg gives): 404, not 410.
    for params in ({"from_snapshot": 12345}, {"from_snapshot": -2597780}, {"to_snapshot": 2**63 - 1}):
        answer = app_client.get(f"/v1/tables/{name}/changes", params=params)
        assert answer.status_code == 404 and "never had a snapshot" in answer.json()["detail"], params
    answer = app_client.post(f"/v1/tables/{name}/consumers", json={"name": "neg", "start": -7})
    assert answer.status_code == 404 and "never had a snapshot -7" in answer.json()["detail"]
    answer = app_client.get(f"/v1/tables/{name}/changes", params={"from_snapshot": second, "to_snapshot": first})
    assert answer.status_code == 409 and "not an ancestor" in answer.json()["detail"]
    assert app_client.get("/v1/tables/nope/changes").status_code == 404
    expire_snapshots(catalog.load_table(table.name()), ExpiryPolicy(max_age_s=0, min_snapshots=1, max_snapshots=1))
    answer = app_client.get(f"/v1/tables/{name}/changes")
    assert answer.status_code == 410 and f"from_snapshot={second}" in answer.json()["detail"]
    # Once history was expired, an id the table lacks may be one that was: 410, saying both.
    answer = app_client.get(f"/v1/tables/{name}/changes", params={"from_snapshot": first})
    assert answer.status_code == 410 and "expired, or never was" in answer.json()["detail"]
    assert app_client.get(f"/v1/tables/{name}/changes", params={"from_snapshot": -1}).status_code == 404


class _DeleteManifestWriter(ManifestWriterV2):
    def content(self) -> ManifestContent:
        return ManifestContent.DELETES


class _AppendEqualityDeletes(_FastAppendFiles):
    """A snapshot adding an equality delete file. A fake writer: no engine on this machine writes
    them (pyiceberg cannot, and Spark's Iceberg runtime is not installed); the table, manifest and
    delete file it leaves are real Iceberg, as Flink or Spark in merge-on-read mode would write."""

    delete_file: DataFile

    def _manifests(self) -> list:
        output = self.new_manifest_output()
        with _DeleteManifestWriter(self._transaction.table_metadata.spec(), self._transaction.table_metadata.schema(), output,
                                   self._snapshot_id, "deflate") as writer:
            writer.add(ManifestEntry.from_args(status=ManifestEntryStatus.ADDED, snapshot_id=self._snapshot_id, data_file=self.delete_file))
        return [*super()._manifests(), writer.to_manifest_file()]


def test_a_table_with_equality_deletes_is_refused_with_what_to_do(app_client, catalog: Catalog) -> None:  # noqa: ANN001
    name, table = new_table(catalog)
    table.append(rows((1, "a"), (2, "b")))
    path = parquet(table, pa.table({"id": pa.array([2], pa.int64())}))
    transaction = table.transaction()
    producer = _AppendEqualityDeletes(operation=Operation.DELETE, transaction=transaction, io=table.io)
    producer.delete_file = DataFile.from_args(
        content=DataFileContent.EQUALITY_DELETES, file_path=path, file_format=FileFormat.PARQUET, partition=Record(),
        record_count=1, file_size_in_bytes=len(table.io.new_input(path)), equality_ids=[1],
    )
    producer.commit()
    transaction.commit_transaction()
    answer = app_client.get(f"/v1/tables/{name}/changes")
    assert answer.status_code == 409, answer.text
    assert "equality delete files" in answer.json()["detail"] and "rewrite_data_files" in answer.json()["detail"]
    answer = app_client.post(f"/v1/tables/{name}/consumers", json={"name": "c", "start": "latest", "initial_load": True})
    assert answer.status_code == 201
    answer = app_client.get(f"/v1/tables/{name}/consumers/c/changes")
    assert answer.status_code == 409 and "equality delete files" in answer.json()["detail"]


def delete_rows(catalog: Catalog, table: Table, positions: dict[str, list[int]], added: pa.Table | None = None,
                deleted_from_added: list[int] = (), replacing: bool = False) -> Table:
    """One merge-on-read snapshot (as Calve's row changes commit it): a position delete file per
    data file of `positions`, and a data file of `added` whose rows `deleted_from_added` its own
    delete file deletes. With `replacing`, each delete file also holds the positions of its data
    file's delete files so far and replaces them (as row_delta_job.py writes them)."""
    table = catalog.load_table(table.name())
    adds = [parquet(table, added)] if added is not None else []
    if deleted_from_added:
        positions = {**positions, adds[0]: list(deleted_from_added)}
    deletes = []
    for data, rows_deleted in positions.items():
        earlier = [file.file_path for file in live_files(table)[1] if referenced_data_file(file) == data] if replacing else []
        for path in earlier:
            with table.io.new_input(path).open() as stream:
                rows_deleted = sorted({*rows_deleted, *pq.read_table(stream).column("pos").to_pylist()})
        path = parquet(table, pa.table({"file_path": [data] * len(rows_deleted), "pos": pa.array(rows_deleted, pa.int64())}))
        deletes.append([path, data, len(rows_deleted), len(table.io.new_input(path)), earlier])
    transaction = table.transaction()
    if deleted_from_added:  # a delete of a file this very snapshot adds: not one row_delta names
        from service.iceberg import private
        from service.iceberg.appends import data_file
        from service.iceberg.rewrites import position_delete_file
        files = [data_file(transaction, path) for path in adds]
        live = {**live_data_files(table), **{file.file_path: file for file in files}}
        with private.row_delta_producer(transaction, {}) as snapshot:
            for file in files:
                snapshot.append_data_file(file)
            for path, data, count, size, _earlier in deletes:
                snapshot.append_delete_file(position_delete_file(path, live[data], count, size, table.metadata.default_spec_id))
    else:
        row_delta(table, transaction, adds, deletes, {})
    transaction.commit_transaction()
    return catalog.load_table(table.name())


def test_a_merge_on_read_tables_position_deletes_are_its_deleted_rows(app_client, catalog: Catalog) -> None:  # noqa: ANN001
    """Position deletes read as the deletes (or old halves of updates) of the rows they name, each
    row once however many delete files its file gathers; carryover goes as on copy-on-write
    tables; a delete of a row its own snapshot added hides both; an initial load leaves deleted
    rows out; a compaction folding the deletes in emits nothing; a consumer paging one row at a
    time ends equal to the table."""
    name, table = new_table(catalog)
    table.append(rows((1, "a"), (2, "b"), (3, "c"), (4, "d")))
    (first,) = live_data_files(catalog.load_table(table.name()))
    start = catalog.load_table(table.name()).current_snapshot().snapshot_id
    answer = app_client.post(f"/v1/tables/{name}/consumers", json={"name": "paged", "start": "earliest"})
    assert answer.status_code == 201, answer.text
    # 2 updated, 3 deleted, 4 written again unchanged (carryover), 5 inserted.
    table = delete_rows(catalog, table, {first: [1, 2, 3]}, rows((2, "B"), (4, "d"), (5, "e")))
    upsert = table.current_snapshot().snapshot_id
    (second,) = set(live_data_files(table)) - {first}
    # 1 deleted from the first file, by a delete file that replaces the first one's (so holds its
    # rows too: they are not deleted again), 5 from the second.
    table = delete_rows(catalog, table, {first: [0], second: [2]}, replacing=True)
    # A row added and deleted by one snapshot (7) is no change at all.
    table = delete_rows(catalog, table, {}, rows((6, "f"), (7, "g")), deleted_from_added=[1])
    assert len(live_files(table)[1]) == 3, "three position delete files, one per data file with deletes"
    expected = [
        ("UPDATE_BEFORE", 2, "b"), ("DELETE", 3, "c"), ("UPDATE_AFTER", 2, "B"), ("INSERT", 5, "e"),
        *sorted([("DELETE", 1, "a"), ("DELETE", 5, "e")], key=lambda row: (first, second)[row[1] != 1]),
        ("INSERT", 6, "f"),
    ]
    got = changes(app_client, name, from_snapshot=start)
    assert brief(got) == expected
    assert {row["_snapshot_id"] for row in got[:4]} == {upsert}
    state = {i: n for i, n in [(1, "a"), (2, "b"), (3, "c"), (4, "d")]}
    consume(app_client, name, "paged", state, limit=1)
    assert state == table_state(catalog, table) == {2: "B", 4: "d", 6: "f"}

    answer = app_client.post(f"/v1/tables/{name}/consumers", json={"name": "loaded", "start": "latest", "initial_load": True})
    assert answer.status_code == 201, answer.text
    loaded: dict = {}
    consume(app_client, name, "loaded", loaded, limit=2)
    assert loaded == table_state(catalog, table), "an initial load reads the live rows only"

    # A compaction folds every delete file in: no changes.
    before = table.current_snapshot().snapshot_id
    data, deletes = live_files(table)
    folded = {path: [d.file_path for d in deletes if d.lower_bounds and d.lower_bounds.get(2147483546) == path.encode()] for path in data}
    transaction = table.transaction()
    replace_files(table, transaction, sorted(data), [parquet(table, rows((2, "B"), (4, "d"), (6, "f")))], {}, folded)
    transaction.commit_transaction()
    table = catalog.load_table(table.name())
    assert live_files(table)[1] == [], "the deletes were folded in"
    assert changes(app_client, name, from_snapshot=before) == []
    consume(app_client, name, "paged", state, limit=1)
    assert state == table_state(catalog, table)


def consume(app_client, name: str, consumer: str, state: dict, limit: int) -> list[str]:  # noqa: ANN001
    """Read and ack pages until the end, applying each change to `state`; the cursors acked."""
    acked = []
    while True:
        answer = app_client.get(f"/v1/tables/{name}/consumers/{consumer}/changes", params={"limit": limit})
        assert answer.status_code == 200, answer.text
        page = answer.json()
        assert len(page["changes"]) <= limit
        for row in page["changes"]:
            if row["_change_type"] in ("INSERT", "UPDATE_AFTER"):
                state[row["id"]] = row["name"]
            else:
                assert state.pop(row["id"]) == row["name"], "a delete names the row as it was"
        assert app_client.post(f"/v1/tables/{name}/consumers/{consumer}/ack", json={"cursor": page["cursor"]}).status_code == 200
        acked.append(page["cursor"])
        if not page["more"]:
            return acked


def table_state(catalog: Catalog, table: Table) -> dict:
    data = catalog.load_table(table.name()).scan().to_arrow().to_pylist()
    return {row["id"]: row["name"] for row in data}


def test_a_consumer_loads_the_table_then_follows_its_changes_resuming_from_its_acks(app_client, catalog: Catalog) -> None:  # noqa: ANN001
    name, table = new_table(catalog)
    table.append(rows(*[(i, f"v{i}") for i in range(7)]))
    table.append(rows(*[(i, f"v{i}") for i in range(7, 12)]))
    answer = app_client.post(f"/v1/tables/{name}/consumers", json={"name": "search", "start": "latest", "initial_load": True})
    assert answer.status_code == 201 and answer.json()["phase"] == "initial_load"
    assert app_client.post(f"/v1/tables/{name}/consumers", json={"name": "search"}).status_code == 409

    first = app_client.get(f"/v1/tables/{name}/consumers/search/changes", params={"limit": 5}).json()
    again = app_client.get(f"/v1/tables/{name}/consumers/search/changes", params={"limit": 5}).json()
    assert first == again, "without an ack the same changes come again"
    assert [row["_change_type"] for row in first["changes"]] == ["INSERT"] * 5 and first["more"]

    state: dict = {}
    consume(app_client, name, "search", state, limit=5)
    assert state == table_state(catalog, table)
    changed = [(i, "changed" if i == 3 else f"v{i}") for i in range(12) if i != 5]
    table = rewrite(catalog, table, rows(*changed))
    table.append(rows((20, "new")))
    acked = consume(app_client, name, "search", state, limit=2)
    assert state == table_state(catalog, table), "the consumer's copy ends equal to the table"
    assert app_client.get(f"/v1/tables/{name}/consumers/search/changes").json()["changes"] == []
    shown = app_client.get(f"/v1/tables/{name}/consumers/search").json()
    assert shown["cursor"] == acked[-1] and shown["phase"] == "changes" and not shown["lagging"]
    answer = app_client.post(f"/v1/tables/{name}/consumers/search/ack", json={"cursor": f"snap:{table.metadata.snapshots[0].snapshot_id}"})
    assert answer.status_code == 409 and "behind" in answer.json()["detail"]
    assert app_client.post(f"/v1/tables/{name}/consumers/search/ack", json={"cursor": "snap:x"}).status_code == 422


def test_expiry_keeps_what_a_consumer_has_not_read_until_it_lags_too_long(app_client, catalog: Catalog) -> None:  # noqa: ANN001
    name, table = new_table(catalog)
    table.append(rows((0, "v0")))
    assert app_client.post(f"/v1/tables/{name}/consumers", json={"name": "slow", "start": "latest"}).status_code == 201
    for i in range(1, 5):
        table.append(rows((i, f"v{i}")))
    table = catalog.load_table(table.name())
    engine = get_engine(app_client.app.state.settings.resolved_database_url())
    keep_one = ExpiryPolicy(max_age_s=0, min_snapshots=1, max_snapshots=1)
    with Session(engine) as session:
        held = protected_snapshots(session, "demo", name, table, max_lag_s=3600)
    assert len(held) == 5, "the consumer's snapshot and every one after it"
    assert expire_snapshots(table, keep_one, held).expired == []
    state = {0: "v0"}
    consume(app_client, name, "slow", state, limit=100)
    assert state == table_state(catalog, table), "nothing it had not read was expired"

    for i in range(5, 8):
        table.append(rows((i, f"v{i}")))
    table = catalog.load_table(table.name())
    with Session(engine) as session:
        assert protected_snapshots(session, "demo", name, table, max_lag_s=0.001) == set(), "held past the lag allowed"
    assert expire_snapshots(table, keep_one, set()).expired
    answer = app_client.get(f"/v1/tables/{name}/consumers/slow/changes")
    assert answer.status_code == 410 and "initial_load" in answer.json()["detail"]
    assert app_client.get(f"/v1/tables/{name}/consumers/slow").json()["lagging"]
    assert app_client.delete(f"/v1/tables/{name}/consumers/slow").status_code == 204
    assert app_client.post(f"/v1/tables/{name}/consumers", json={"name": "slow", "start": "latest", "initial_load": True}).status_code == 201
    state = {}
    consume(app_client, name, "slow", state, limit=3)
    assert state == table_state(catalog, table)


def test_a_table_whose_snapshot_has_no_manifests_is_described_with_no_files(app_client, catalog: Catalog) -> None:  # noqa: ANN001
    """What purges and replays can leave (here: an overwrite with no rows): was a 500."""
    name, table = new_table(catalog)
    table.append(rows((1, "a")))
    table.overwrite(rows())
    assert catalog.load_table(table.name()).current_snapshot().manifests(table.io) == []
    answer = app_client.get(f"/v1/tables/{name}")
    assert answer.status_code == 200, answer.text
    assert answer.json()["health"]["data_files"] == 0 and answer.json()["health"]["manifests"] == 0


def test_every_consumer_route_takes_the_scopes_the_readme_names(app_client, catalog: Catalog) -> None:  # noqa: ANN001
    """Pages are read with `read` or `consume`; the cursor moves with `consume` or `admin`;
    consumers are created and deleted with `admin`. A read-only token used to create, delete and
    acknowledge (making an application skip changes)."""
    name, table = new_table(catalog)
    table.append(rows((1, "a")))
    tokens = {}
    for scope in ("ingest", "read", "consume", "admin"):
        answer = app_client.post("/v1/tokens", json={"scopes": [scope]})
        assert answer.status_code == 201, answer.text
        tokens[scope] = {"Authorization": f"Bearer {answer.json()['token']}"}
    allowed = {
        ("POST", "consumers"): {"admin"}, ("GET", "consumers"): {"read", "consume"}, ("GET", "consumers/c"): {"read", "consume"},
        ("GET", "consumers/c/changes"): {"read", "consume"}, ("POST", "consumers/c/ack"): {"consume", "admin"},
        ("DELETE", "consumers/c"): {"admin"},
    }
    for (method, route), scopes in allowed.items():
        for scope, headers in tokens.items():
            if route == "consumers/c/ack":
                page = app_client.get(f"/v1/tables/{name}/consumers/c/changes").json()
                body = {"cursor": page["cursor"]}
            else:
                body = {"name": "c", "start": "earliest"} if method == "POST" else None
            answer = app_client.request(method, f"/v1/tables/{name}/{route}", json=body, headers=headers)
            if scope in scopes:
                assert answer.status_code in (200, 201, 204), (method, route, scope, answer.text)
                if method == "DELETE":  # again, for the next scope that may delete
                    assert app_client.post(f"/v1/tables/{name}/consumers", json={"name": "c", "start": "earliest"}).status_code == 201
            else:
                assert answer.status_code == 403 and "scope" in answer.json()["detail"], (method, route, scope, answer.text)
