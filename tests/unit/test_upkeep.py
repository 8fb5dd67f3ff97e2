"""Table upkeep against a real Iceberg table (SQLite catalog, files on disk): what expiry lets go,
what it keeps, the files it deletes, and the manifests merged at commit time."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.expressions import EqualTo
from pyiceberg.manifest import ManifestContent

from service.core import keys
from service.core.exceptions import FilesNotLive, RowsChanged
from service.iceberg.appends import append_files
from service.iceberg.catalog import create_table_once, get_catalog
from service.iceberg.compaction import COLD_TIER_GROWTH, TIER_GROWTH, CompactionPolicy, compactable, plan_compaction
from service.iceberg.rewrites import live_data_files, replace_files
from service.iceberg.upkeep import (
    ExpiryPolicy,
    expire_snapshots,
    merge_manifests,
    sink_properties,
    snapshots_to_expire,
)
from service.iceberg.watermark import watermark


@pytest.fixture
def table(tmp_path: Path):  # noqa: ANN201
    catalog = get_catalog.__wrapped__(f"sqlite:///{tmp_path / 'catalog.db'}", (tmp_path / "wh").as_uri())
    return create_table_once(catalog, "acme", "events", pa.schema([pa.field("id", pa.string())]))


def commit(table, tmp_path: Path, n: int, rows: int = 1) -> None:  # noqa: ANN001
    """One committer-style commit of one small file (of `rows` rows), with the watermark n-0."""
    path = tmp_path / f"part-{n}.parquet"
    pq.write_table(pa.table({"id": [f"e{n}"] if rows == 1 else [f"e{n}-{i}" for i in range(rows)]}), path)
    with table.transaction() as transaction:
        append_files(transaction, [path.as_uri()], {keys.SUMMARY_WATERMARK: f"{n}-0"})


def files_under(table, kind: str) -> int:  # noqa: ANN001
    root = Path(table.location().removeprefix("file://")) / "metadata"
    return sum(1 for path in root.iterdir() if kind in path.name)


def test_expiry_keeps_the_newest_within_the_policy_and_what_is_protected(table, tmp_path: Path) -> None:  # noqa: ANN001
    for n in range(1, 13):
        commit(table, tmp_path, n)
    snapshots = sorted(table.metadata.snapshots, key=lambda s: s.timestamp_ms)
    now_ms = snapshots[-1].timestamp_ms
    by_count = snapshots_to_expire(table.metadata, ExpiryPolicy(max_age_s=3600, max_snapshots=5, min_snapshots=2), now_ms)
    assert by_count == [s.snapshot_id for s in snapshots[:7]], "the oldest beyond the newest five, oldest first"
    protected = {snapshots[0].snapshot_id}
    assert snapshots[0].snapshot_id not in snapshots_to_expire(
        table.metadata, ExpiryPolicy(max_age_s=3600, max_snapshots=5), now_ms, protected
    )
    # Everything is older than the age limit here, but the newest min_snapshots always stay.
    by_age = snapshots_to_expire(table.metadata, ExpiryPolicy(max_age_s=0.001, max_snapshots=100, min_snapshots=3), now_ms + 10_000)
    assert by_age == [s.snapshot_id for s in snapshots[:9]]


def test_expiry_bounds_history_and_deletes_only_what_expired_snapshots_alone_referenced(table, tmp_path: Path) -> None:  # noqa: ANN001
    for n in range(1, 31):
        commit(table, tmp_path, n)
    rows_before = sorted(table.scan().to_arrow().column("id").to_pylist())
    lists_before = files_under(table, "snap-")
    assert len(table.current_snapshot().manifests(table.io)) <= 20, "manifests are merged at commit time"

    result = expire_snapshots(table, ExpiryPolicy(max_age_s=3600, max_snapshots=10, min_snapshots=2))
    assert len(result.expired) == 20 and len(table.metadata.snapshots) == 10
    assert len(table.metadata.snapshot_log) == 10, "the snapshot log is bounded with them"
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == rows_before, "every row is still read"
    assert watermark(table) == "30-0"
    assert files_under(table, "snap-") == lists_before - 20, "the expired snapshots' manifest lists are gone"
    assert all(Path(p.removeprefix("file://")).exists() for p in table.inspect.data_files().column("file_path").to_pylist())

    # A delete (the DLQ purge's kind) leaves a data file that only older snapshots reference: once
    # they expire, the file goes too.
    doomed = next(p for p in table.inspect.data_files().column("file_path").to_pylist() if p.endswith("part-3.parquet"))
    table.delete(EqualTo("id", "e3"))
    commit(table, tmp_path, 31)
    expire_snapshots(table, ExpiryPolicy(max_age_s=3600, max_snapshots=1, min_snapshots=1))
    assert not Path(doomed.removeprefix("file://")).exists()
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == sorted({*rows_before, "e31"} - {"e3"})


def test_the_watermark_snapshot_survives_expiry_when_newer_snapshots_carry_none(table, tmp_path: Path) -> None:  # noqa: ANN001
    commit(table, tmp_path, 1)
    first = table.current_snapshot().snapshot_id
    commit(table, tmp_path, 2)
    for n in range(3):
        table.append(pa.table({"id": [f"other{n}"]}))  # snapshots without a watermark on top (another writer's)
        time.sleep(0.002)
    result = expire_snapshots(table, ExpiryPolicy(max_age_s=3600, max_snapshots=1, min_snapshots=1))
    assert result.expired == [first], "the holder of the watermark and every snapshot above it stay"
    assert watermark(table) == "2-0", "recovery still finds the last committed entry"


def test_orphans_older_than_the_safety_age_go_and_the_rest_stay(table, tmp_path: Path) -> None:  # noqa: ANN001
    import os

    from service.iceberg.upkeep import remove_orphans

    data = Path(table.location().removeprefix("file://")) / "data"
    committed = data / "batch-committed" / "part-0.parquet"
    committed.parent.mkdir(parents=True)
    pq.write_table(pa.table({"id": ["kept"]}), committed)
    with table.transaction() as transaction:
        append_files(transaction, [committed.as_uri()], {keys.SUMMARY_WATERMARK: "1-0"})
    leftovers = data / "batch-superseded"
    leftovers.mkdir()
    old = [leftovers / "part-0.parquet", leftovers / "_SUCCESS", leftovers / ".part-0.parquet.crc"]
    young, waiting = data / "batch-writing" / "part-0.parquet", data / "batch-handed-off" / "part-0.parquet"
    for path in (*old, young, waiting):
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"x")
    day_ago = time.time() - 2 * 24 * 3600
    for path in (*old, waiting, committed):
        os.utime(path, (day_ago, day_ago))

    deleted = remove_orphans(table, min_age_s=24 * 3600, protected={waiting.as_uri()})
    assert deleted == 3 and not any(path.exists() for path in old)
    assert committed.exists() and young.exists() and waiting.exists()
    assert table.scan().to_arrow().column("id").to_pylist() == ["kept"]


def test_compaction_plans_a_partition_once_it_holds_enough_small_files(table, tmp_path: Path) -> None:  # noqa: ANN001
    for n in range(1, 13):
        commit(table, tmp_path, n)
    files = compactable(table)
    one_file = files[0].file.file_size_in_bytes
    policy = CompactionPolicy(target_file_bytes=1024 * 1024, min_files=10, max_bytes=1024 * 1024)
    (group,) = plan_compaction(files, policy)
    assert len(group.files) == 12 and group.outputs == 1
    assert plan_compaction(files, CompactionPolicy(1024 * 1024, min_files=13, max_bytes=1024 * 1024)) == [], "too few small files"
    # Small files adding up to a whole target file qualify however few they are.
    (whole,) = plan_compaction(files, CompactionPolicy(one_file * 3, min_files=100, max_bytes=1024 * 1024))
    assert whole.outputs == 4
    # A request rewrites at most max_bytes.
    (bounded,) = plan_compaction(files, CompactionPolicy(1024 * 1024, min_files=2, max_bytes=one_file * 5))
    assert len(bounded.files) == 5


def test_scheduled_compaction_merges_small_files_by_size_tier_and_by_hand_takes_them_all(table, tmp_path: Path) -> None:  # noqa: ANN001
    commit(table, tmp_path, 1, rows=20_000)  # a partition's earlier rows, in one larger file
    for n in range(2, 12):
        commit(table, tmp_path, n)  # then a small file per run
    large = max(compactable(table), key=lambda candidate: candidate.file.file_size_in_bytes).file
    policy = CompactionPolicy(target_file_bytes=64 * 1024 * 1024, min_files=10, max_bytes=1 << 30)
    (group,) = plan_compaction(compactable(table), policy)
    assert len(group.files) == 10 and large.file_path not in {file.file_path for file in group.files}, "the small files among themselves"
    (everything,) = plan_compaction(compactable(table), policy.everything())
    assert len(everything.files) == 11, "by hand: every small file of the partition"
    # Once the smaller files add up to half the larger one's size, it joins them.
    n = 12
    while 2 * sum(c.file.file_size_in_bytes for c in compactable(table) if c.file.file_path != large.file_path) < large.file_size_in_bytes:
        commit(table, tmp_path, n, rows=500)
        n += 1
    (group,) = plan_compaction(compactable(table), policy)
    assert len(group.files) == n - 1 and large.file_path in {file.file_path for file in group.files}


def test_a_cold_partition_merges_two_small_files_by_wider_tiers_and_a_warm_one_waits_for_min_files(table, tmp_path: Path) -> None:  # noqa: ANN001
    for n, rows in enumerate((3000, 700), start=1):  # a backfill's pieces of one partition
        commit(table, tmp_path, n, rows=rows)
    committed = sorted(snapshot.timestamp_ms for snapshot in table.metadata.snapshots)
    merge_manifests(table)  # existing entries keep the snapshot that added their file
    assert sorted(candidate.added_ms for candidate in compactable(table)) == committed
    smallest, larger = sorted(candidate.file.file_size_in_bytes for candidate in compactable(table))
    assert TIER_GROWTH * smallest < larger <= COLD_TIER_GROWTH * smallest, "sizes apart by more than a warm tier, within a cold one"
    policy = CompactionPolicy(target_file_bytes=64 * 1024 * 1024, min_files=2, max_bytes=1 << 30, cold_after_s=60)
    newest = committed[-1]
    assert plan_compaction(compactable(table), policy, now_ms=newest + 59_000) == [], "warm: the larger file is not the small one's tier"
    assert plan_compaction(compactable(table), replace(policy, cold_after_s=None), now_ms=newest + 3_600_000) == []
    (group,) = plan_compaction(compactable(table), replace(policy, min_files=10), now_ms=newest + 61_000)
    assert len(group.files) == 2 and group.outputs == 1, "cold: two small files are enough, in the wider tier"
    # A late file beside a cold partition's larger one stays alone: the large file is not copied for it.
    with table.transaction() as transaction:
        merged = tmp_path / "merged.parquet"
        pq.write_table(pa.concat_tables([pq.read_table(file.file_path.removeprefix("file://")) for file in group.files]), merged)
        replace_files(table, transaction, [file.file_path for file in group.files], [merged.as_uri()], {keys.SUMMARY_WATERMARK: "3-0"})
    commit(table, tmp_path, 4)
    late = max(snapshot.timestamp_ms for snapshot in table.metadata.snapshots)
    assert plan_compaction(compactable(table), policy, now_ms=late + 61_000) == []


def test_files_that_would_come_out_as_many_as_they_went_in_are_left_as_they_are(table, tmp_path: Path) -> None:  # noqa: ANN001
    """Small files too large to share a target file are not copied into as many files as they
    were (which would be as small, and planned again at every round), by schedule or by hand;
    a third file makes a merge that leaves fewer."""
    for n in (1, 2):
        commit(table, tmp_path, n, rows=3000)
    size = max(candidate.file.file_size_in_bytes for candidate in compactable(table))
    policy = CompactionPolicy(target_file_bytes=size * 3 // 2, min_files=2, max_bytes=1 << 30, cold_after_s=60)
    newest = max(snapshot.timestamp_ms for snapshot in table.metadata.snapshots)
    assert plan_compaction(compactable(table), policy) == []
    assert plan_compaction(compactable(table), policy, now_ms=newest + 61_000) == [], "cold"
    assert plan_compaction(compactable(table), policy.everything()) == [], "by hand"
    commit(table, tmp_path, 3, rows=3000)
    (group,) = plan_compaction(compactable(table), policy)
    assert len(group.files) == 3 and group.outputs == 2


def test_a_file_too_small_for_a_tier_alone_joins_the_next_tier_and_never_holds_it_back(table, tmp_path: Path) -> None:  # noqa: ANN001
    for n, rows in enumerate((1, 3000, 3000), start=1):  # a backfill's one-row piece of a day, then its larger pieces
        commit(table, tmp_path, n, rows=rows)
    (group,) = plan_compaction(compactable(table), CompactionPolicy(target_file_bytes=64 * 1024 * 1024, min_files=2, max_bytes=1 << 30))
    assert len(group.files) == 3, "the larger pieces make a tier, and the one-row piece joins it"


def test_a_replace_keeps_the_rows_and_refuses_files_no_longer_live(table, tmp_path: Path) -> None:  # noqa: ANN001
    for n in range(1, 5):
        commit(table, tmp_path, n)
    before = sorted(table.scan().to_arrow().column("id").to_pylist())
    small = sorted(live_data_files(table))
    merged = tmp_path / "merged.parquet"
    pq.write_table(pa.concat_tables([pq.read_table(path.removeprefix("file://")) for path in small]), merged)
    with table.transaction() as transaction:
        done = replace_files(table, transaction, small, [merged.as_uri()], {keys.SUMMARY_WATERMARK: "9-0"})
    assert (done.files_removed, done.files_added, done.rows) == (4, 1, 4)
    assert table.current_snapshot().summary.operation.value == "replace"
    assert watermark(table) == "9-0"
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == before
    assert sorted(live_data_files(table)) == [merged.as_uri()]

    again = tmp_path / "again.parquet"
    pq.write_table(pq.read_table(merged), again)
    with pytest.raises(FilesNotLive), table.transaction() as transaction:
        replace_files(table, transaction, small, [again.as_uri()], {})
    fewer = tmp_path / "fewer.parquet"
    pq.write_table(pq.read_table(merged).slice(0, 3), fewer)
    with pytest.raises(RowsChanged), table.transaction() as transaction:
        replace_files(table, transaction, [merged.as_uri()], [fewer.as_uri()], {})
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == before


def test_a_compaction_leaves_the_table_one_data_manifest(table, tmp_path: Path) -> None:  # noqa: ANN001
    """A compacted table is planned as one that never took a change: the compaction's snapshot
    merges the data manifests of the commits before it, not only the files it rewrites."""
    for n in range(1, 7):
        commit(table, tmp_path, n)  # a manifest each
    before = sorted(table.scan().to_arrow().column("id").to_pylist())
    two = sorted(live_data_files(table))[:2]
    merged = tmp_path / "merged.parquet"
    pq.write_table(pa.concat_tables([pq.read_table(path.removeprefix("file://")) for path in two]), merged)
    with table.transaction() as transaction:
        replace_files(table, transaction, two, [merged.as_uri()], {keys.SUMMARY_WATERMARK: "9-0"})
    manifests = table.current_snapshot().manifests(table.io)
    assert [manifest.content for manifest in manifests] == [ManifestContent.DATA], manifests
    assert sorted(table.scan().to_arrow().column("id").to_pylist()) == before
    assert len(live_data_files(table)) == 5


def test_a_table_keeps_its_own_expiry_policy_from_its_sink(table) -> None:  # noqa: ANN001
    default = ExpiryPolicy(max_age_s=3600, max_snapshots=100, min_snapshots=5)
    assert default.for_table(table) == default
    with table.transaction() as transaction:
        transaction.set_properties(sink_properties(None, max_age_s=86400, max_count=500))
    assert default.for_table(table) == ExpiryPolicy(max_age_s=86400, max_snapshots=500, min_snapshots=5)
