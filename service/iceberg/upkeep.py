"""Keeping a streamed-to table healthy: snapshot expiry, and deleting the files only expired
snapshots referenced. Manifests are merged at commit time (TABLE_PROPERTIES in catalog.py), and
old metadata.json versions deleted after each commit, so neither grows with the commit count.

Only the table's leader runs these (see the package docstring): an expiry is a metadata commit
like any other, compare-and-swap on the table, and it never removes
- the current snapshot, the newest snapshot carrying Calve's watermark (recovery reads it) and
  every snapshot between the two,
- branch heads and tagged snapshots,
- snapshots a caller protects (the change feed's readers, when they come),
- the newest `min_snapshots`, whatever their age.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from pyarrow import fs as pafs
from pyiceberg.io import FileIO
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.snapshots import Snapshot

from service.core import keys
from service.iceberg import files, private
from service.iceberg.compaction import TARGET_FILE_SIZE_PROPERTY
from service.iceberg.rewrites import WRITE_MODE_PROPERTIES
from service.iceberg.watermark import ahead, calve_snapshots, spell_runs, watermark

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExpiryPolicy:
    """How much history a table keeps: snapshots younger than `max_age_s`, at most `max_snapshots`
    of them, and never fewer than `min_snapshots`."""

    max_age_s: float
    max_snapshots: int
    min_snapshots: int = 5

    def for_table(self, table: Table) -> ExpiryPolicy:
        """The table's own policy where its properties set one (a sink's snapshot_max_age and
        snapshot_max_count; Iceberg's own history.expire.* properties), this one elsewhere."""
        properties = table.properties
        age_ms = _positive(properties.get(MAX_AGE_PROPERTY))
        count = _positive(properties.get(MAX_COUNT_PROPERTY))
        keep = _positive(properties.get(MIN_COUNT_PROPERTY))
        return ExpiryPolicy(
            age_ms / 1000 if age_ms else self.max_age_s, count or self.max_snapshots, keep or self.min_snapshots,
        )


MAX_AGE_PROPERTY = "history.expire.max-snapshot-age-ms"  # Iceberg's
MIN_COUNT_PROPERTY = "history.expire.min-snapshots-to-keep"  # Iceberg's
MAX_COUNT_PROPERTY = "calve.expire.max-snapshots"  # Iceberg has no count limit of its own


def _positive(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() and int(value) > 0 else None


def sink_properties(
    target_file_size: int | None, max_age_s: float | None, max_count: int | None, write_mode: str | None = None,
) -> dict[str, str]:
    """The table properties a sink's upkeep settings become (read back by the table's leader),
    and its write mode (Iceberg's own properties: read back by the writer applying row changes)."""
    properties = dict.fromkeys(WRITE_MODE_PROPERTIES, write_mode) if write_mode else {}
    if target_file_size:
        properties[TARGET_FILE_SIZE_PROPERTY] = str(target_file_size)
    if max_age_s:
        properties[MAX_AGE_PROPERTY] = str(int(max_age_s * 1000))
    if max_count:
        properties[MAX_COUNT_PROPERTY] = str(max_count)
    return properties


@dataclass
class ExpiryResult:
    expired: list[int] = field(default_factory=list)
    files_deleted: int = 0
    seconds: float = 0.0


def snapshots_to_expire(metadata: TableMetadata, policy: ExpiryPolicy, now_ms: int, protected: set[int] = frozenset()) -> list[int]:
    """The snapshots the policy lets go, oldest first (no I/O)."""
    keep = set(protected) | {
        ref.snapshot_id for ref in metadata.refs.values() if ref.snapshot_ref_type in (SnapshotRefType.BRANCH, SnapshotRefType.TAG)
    }
    if metadata.current_snapshot_id is not None:
        keep.add(metadata.current_snapshot_id)
    newest_first = sorted(metadata.snapshots, key=lambda s: (s.timestamp_ms, s.sequence_number or 0), reverse=True)
    cutoff_ms = now_ms - int(policy.max_age_s * 1000)
    expire = [
        snapshot.snapshot_id
        for rank, snapshot in enumerate(newest_first)
        if rank >= policy.min_snapshots
        and (rank >= policy.max_snapshots or snapshot.timestamp_ms < cutoff_ms)
        and snapshot.snapshot_id not in keep
    ]
    return list(reversed(expire))


def expire_snapshots(table: Table, policy: ExpiryPolicy, protected: set[int] = frozenset()) -> ExpiryResult:
    """Expire what the policy lets go (one catalog commit), then delete the manifest lists,
    manifests and data files that only the expired snapshots referenced."""
    started = time.monotonic()
    protected = set(protected) | watermark_path(table)
    expired = snapshots_to_expire(table.metadata, policy.for_table(table), int(time.time() * 1000), protected)
    if not expired:
        return ExpiryResult(seconds=time.monotonic() - started)
    before = list(table.metadata.snapshots)
    table.maintenance.expire_snapshots().by_ids(expired).commit()
    gone = {snapshot.snapshot_id for snapshot in before} - {snapshot.snapshot_id for snapshot in table.metadata.snapshots}
    kept = [snapshot for snapshot in table.metadata.snapshots]
    deleted = delete_unreferenced(table.io, [s for s in before if s.snapshot_id in gone], kept)
    return ExpiryResult(sorted(gone), deleted, time.monotonic() - started)


def watermark_path(table: Table) -> set[int]:
    """The current snapshot's ancestry down to the newest snapshot carrying Calve's watermark:
    recovery reads the watermark by walking that ancestry, and expiring a snapshot in between
    would cut the walk short."""
    holders = calve_snapshots(table)
    if not holders:
        return set()
    path, snapshot = set(), table.current_snapshot()
    while snapshot is not None:
        path.add(snapshot.snapshot_id)
        if snapshot.snapshot_id == holders[0].snapshot_id or snapshot.parent_snapshot_id is None:
            break
        snapshot = table.snapshot_by_id(snapshot.parent_snapshot_id)
    return path


def _referenced(io: FileIO, snapshots: list[Snapshot], read: dict[str, list[str]]) -> tuple[set[str], set[str], set[str]]:
    """(manifest lists, manifests, data and delete files) the snapshots reference; each manifest is
    read once (`read` caches its file paths across calls)."""
    lists, manifests, files = set(), set(), set()
    for snapshot in snapshots:
        lists.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(io):
            manifests.add(manifest.manifest_path)
            if manifest.manifest_path not in read:
                read[manifest.manifest_path] = [
                    entry.data_file.file_path for entry in manifest.fetch_manifest_entry(io, discard_deleted=False)
                ]
            files.update(read[manifest.manifest_path])
    return lists, manifests, files


def delete_unreferenced(io: FileIO, expired: list[Snapshot], kept: list[Snapshot]) -> int:
    """Delete what `expired` referenced and `kept` does not; the count deleted. A file already
    gone (deleted by an earlier run that stopped halfway) is not an error."""
    read: dict[str, list[str]] = {}
    kept_lists, kept_manifests, kept_files = _referenced(io, kept, read)
    old_lists, old_manifests, old_files = _referenced(io, expired, read)
    doomed = (old_files - kept_files) | (old_manifests - kept_manifests) | (old_lists - kept_lists)
    deleted = 0
    for path in sorted(doomed):
        try:
            io.delete(path)
            deleted += 1
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("upkeep: could not delete %s (%s); orphan removal will retry", path, exc)
    return deleted


def remove_orphans(table: Table, min_age_s: float, protected: set[str] = frozenset()) -> int:
    """Delete files under the table's data location that no snapshot references, that are older
    than `min_age_s`, and that the caller does not protect (files handed off and not committed
    yet, or parked on the dead commit stream): leftovers of superseded hand-offs, crashed writers,
    failed jobs, and Spark's `.crc` and `_SUCCESS` side files. The age keeps a file a writer is
    still writing, or has just handed off, safe."""
    data_location = f"{table.location().rstrip('/')}/data"
    filesystem, root = files.locate(data_location, table.io)
    if filesystem.get_file_info(root).type == pafs.FileType.NotFound:
        return 0
    scheme = data_location[: len(data_location) - len(root)] if data_location.endswith(root) else ""
    referenced = set(table.inspect.all_files().column("file_path").to_pylist()) if table.metadata.snapshots else set()
    keep = referenced | set(protected)
    cutoff = time.time() - min_age_s
    deleted = 0
    for info in filesystem.get_file_info(pafs.FileSelector(root, recursive=True)):
        if not info.is_file or info.mtime is None or info.mtime.timestamp() >= cutoff:
            continue
        if f"{scheme}{info.path}" in keep:
            continue
        try:
            filesystem.delete_file(info.path)
            deleted += 1
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("upkeep: could not delete orphan %s (%s)", info.path, exc)
    return deleted


def merge_manifests(table: Table) -> int:
    """Merge the current snapshot's manifests (a `replace` snapshot carrying the watermark on);
    the manifests it had, or 0 when there was nothing to merge. Commits merge as they go; this is
    for a table another writer left with many, or by hand."""
    snapshot = table.current_snapshot()
    manifests = len(snapshot.manifests(table.io)) if snapshot is not None else 0
    if manifests < 2:
        return 0
    properties = {keys.SUMMARY_WATERMARK: watermark(table)} if calve_snapshots(table) else {}
    if runs := ahead(table):  # the entries committed beyond the watermark are still in the table
        properties[keys.SUMMARY_AHEAD] = spell_runs(runs)
    with table.transaction() as transaction, private.merge_manifests_producer(transaction, properties):
        pass
    return manifests
