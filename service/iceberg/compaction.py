"""Which files to compact: per partition, small files bin-packed toward the table's target file
size, and (merge-on-read) files with many rows deleted, rewritten with their deletes applied.

Scheduled compactions merge small files by size tier: a partition's smallest files together, a
larger file joining them only once the smaller ones add up to half its size (TIER_GROWTH). A partition that takes a
small file per change run (or per writer batch) beside one large file of its earlier rows then
merges the new files among themselves, not into the large file every time: each row is copied
a few times (once per doubling), not once per compaction. A compaction asked for by hand takes
every small file of a partition.

A cold partition, one no file has been added to for `cold_after_s` (yesterday's day partition,
the days a backfill loaded), has its small files merged once two of them qualify, not
`min_files`, and by wider tiers (COLD_TIER_GROWTH: a backfill's pieces of a day differ in size
more than twice): nothing more will come to batch them with, and a reader pays for each file it
opens (pyiceberg ~2 ms a file), so a table's settled partitions end as one file each, or a few.
A late event into a cold partition does not have its large file copied: the tier still stops at
a file more than COLD_TIER_GROWTH times the smaller ones together. When a file was added is read
from its snapshot; a file whose snapshot has expired counts as old, so on a table that commits
more often than `snapshot_max_count` an hour, a partition none of whose files a kept snapshot
added is cold sooner than `cold_after_s` (its merges are tiered all the same).

Planning reads only table metadata (file sizes and partitions); the rewrite itself runs on Spark
(spark_jobs/compact_job.py, submitted by a writer) and is committed as a `replace` snapshot by the
table's leader (rewrites.py). The target is the table's `write.target-file-size-bytes`, Iceberg's
own property, which Calve sets from a sink's `target_file_size`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from pyiceberg.manifest import DataFile
from pyiceberg.table import Table

from service.core.config import Settings
from service.iceberg.manifests import added_by, live_entries
from service.iceberg.rewrites import deletes_by_file, live_files, referenced_data_file

TARGET_FILE_SIZE_PROPERTY = "write.target-file-size-bytes"
SMALL_FILE_RATIO = 0.75  # a file below this share of the target is small (Iceberg's bin-pack default)
TIER_GROWTH = 2  # a file joins smaller ones being merged when it is at most this many times their size
COLD_TIER_GROWTH = 8  # the same, in a cold partition


@dataclass(frozen=True)
class CompactionPolicy:
    """When a partition is compacted: a reader opens at least `min_files` files for its small
    files (each small file and each of its position delete files: `opened`), or small files
    adding up to a whole target file, or a file whose position deletes delete `deleted_share` of
    its rows or number `delete_files` (folded in, whatever its size); a request rewrites at most
    `max_bytes` (one Spark job's worth)."""

    target_file_bytes: int
    min_files: int
    max_bytes: int
    deleted_share: float = 0.3
    delete_files: int = 10
    tiered: bool = True  # small files merged by size tier (else every small file of a partition)
    cold_after_s: float | None = None  # a partition without a new file for this long is cold (None: never)

    @classmethod
    def from_settings(cls, settings: Settings) -> CompactionPolicy:
        return cls(settings.compact_target_file_bytes, settings.compact_min_files, settings.compact_max_bytes,
                   settings.compact_deleted_share, settings.compact_delete_files, cold_after_s=settings.compact_cold_after_s)

    def for_table(self, table: Table) -> CompactionPolicy:
        own = table.properties.get(TARGET_FILE_SIZE_PROPERTY)
        if own and own.isdigit() and int(own) > 0:
            return replace(self, target_file_bytes=int(own))
        return self

    def everything(self) -> CompactionPolicy:
        """By hand: any two small files qualify, every small file of a partition is taken, and
        every file with deletes folds them in."""
        return replace(self, min_files=2, delete_files=1, tiered=False)

    def folds(self, candidate: Candidate) -> bool:
        """Whether the file's deletes alone make it worth rewriting."""
        return bool(candidate.deletes) and (
            len(candidate.deletes) >= self.delete_files or candidate.deleted_rows >= self.deleted_share * candidate.file.record_count
        )


@dataclass(frozen=True)
class Candidate:
    """A live data file a compaction may rewrite, and the position delete files (each naming it
    alone) whose rows it would leave out."""

    file: DataFile
    deletes: list[DataFile] = field(default_factory=list)
    added_ms: int = 0  # when the snapshot that added it was committed (0: unknown, that snapshot expired)

    @property
    def deleted_rows(self) -> int:
        return sum(delete.record_count for delete in self.deletes)

    @property
    def bytes_kept(self) -> float:
        """Its size, less the deleted rows' share."""
        rows = self.file.record_count
        return self.file.file_size_in_bytes * (1 - min(self.deleted_rows, rows) / rows) if rows else 0.0


@dataclass(frozen=True)
class CompactionGroup:
    """Files of one partition, rewritten into `outputs` files with their deletes applied."""

    candidates: list[Candidate]
    outputs: int

    @property
    def files(self) -> list[DataFile]:
        return [candidate.file for candidate in self.candidates]

    @property
    def deletes(self) -> dict[str, list[str]]:
        """Per file with deleted rows, its delete files' paths."""
        return {c.file.file_path: [d.file_path for d in c.deletes] for c in self.candidates if c.deletes}


def compactable(table: Table) -> list[Candidate]:
    """The live data files a compaction may rewrite, each with its delete files and when it was
    added: all but those a delete file without file_path bounds may apply to (another engine's,
    scoped to a partition; or an equality delete), which a rewrite could not account for row by
    row."""
    data, deletes = live_files(table)
    applying = deletes_by_file(data, deletes)
    committed = {snapshot.snapshot_id: snapshot.timestamp_ms for snapshot in table.metadata.snapshots}
    added: dict[str, int] = {}
    for manifest in table.current_snapshot().manifests(table.io) if table.current_snapshot() else []:
        for file, snapshot_id in zip(live_entries(manifest, table.io), added_by(manifest, table.io), strict=True):
            added[file.file_path] = committed.get(snapshot_id, 0)
    return [
        Candidate(file, applying.get(path, []), added.get(path, 0))
        for path, file in data.items()
        if all(referenced_data_file(delete) == path for delete in applying.get(path, []))
    ]


def plan_compaction(candidates: Iterable[Candidate], policy: CompactionPolicy, spec_id: int = 0,
                    now_ms: int | None = None) -> list[CompactionGroup]:
    """The partitions worth compacting now, those with files to fold deletes into first, then
    most small files first, within `policy.max_bytes`. Only files of the table's current
    partition spec (`spec_id`): a file of an older spec may span several of today's partitions.
    With `now_ms`, a partition no file was added to for `policy.cold_after_s` is cold: two of
    its small files are enough."""
    small_limit = policy.target_file_bytes * SMALL_FILE_RATIO
    by_partition: dict[tuple, list[Candidate]] = defaultdict(list)
    newest: dict[tuple, int] = defaultdict(int)
    for candidate in candidates:
        file = candidate.file
        newest[(file.spec_id, file.partition)] = max(newest[(file.spec_id, file.partition)], candidate.added_ms)
        if file.spec_id == spec_id and (file.file_size_in_bytes < small_limit or policy.folds(candidate)):
            by_partition[(file.spec_id, file.partition)].append(candidate)
    cold_before = None if now_ms is None or policy.cold_after_s is None else now_ms - policy.cold_after_s * 1000
    groups, planned = [], 0
    ordered = sorted(by_partition.values(), key=lambda chosen: (any(policy.folds(c) for c in chosen), len(chosen)), reverse=True)
    for chosen in ordered:
        file = chosen[0].file
        cold = cold_before is not None and newest[(file.spec_id, file.partition)] < cold_before
        folding = any(policy.folds(candidate) for candidate in chosen)
        # Files to fold first, then the rest, smallest first; the same choice every time for the same files.
        chosen.sort(key=lambda candidate: (not policy.folds(candidate), candidate.file.file_size_in_bytes, candidate.file.file_path))
        if policy.tiered:
            chosen = _tier(chosen, policy, COLD_TIER_GROWTH if cold else TIER_GROWTH)
        if not folding:
            total = sum(candidate.file.file_size_in_bytes for candidate in chosen)
            if len(chosen) < 2 or (not cold and opened(chosen) < policy.min_files and total < policy.target_file_bytes):
                continue
        taken, size, kept = [], 0, 0.0
        for candidate in chosen:
            if taken and planned + size + candidate.file.file_size_in_bytes > policy.max_bytes:
                break
            taken.append(candidate)
            size += candidate.file.file_size_in_bytes
            kept += candidate.bytes_kept
        if len(taken) < 2 and not any(candidate.deletes for candidate in taken):
            break
        outputs = max(1, math.ceil(kept / policy.target_file_bytes))
        if outputs >= len(taken) and not any(candidate.deletes for candidate in taken):
            # As many files out as in: nothing merged, and as small as before, so planned again
            # at every round. Two files of 87 MiB (small under a 128 MiB target) were copied into
            # two of 87 MiB about once a minute per partition, for as long as the stack ran (a
            # long `make bench`: a compaction of 175-660 MiB in nearly every shape's window).
            continue
        groups.append(CompactionGroup(taken, outputs))
        planned += size
        if planned >= policy.max_bytes:
            break
    return groups


def opened(candidates: Iterable[Candidate]) -> int:
    """The files a reader opens for these: each data file and each of its delete files. A delete
    file costs a reader an open as a data file does (pyiceberg ~1 ms a small one), so a
    merge-on-read partition whose small files each have one is merged at half as many files:
    `make bench-upsert`'s table as the changes left it held 63 data files and 33 delete files
    against 84 and 54, and pyiceberg read it 2.7 times as long as compacted, against 3.7."""
    return sum(1 + len(candidate.deletes) for candidate in candidates)


def _tier(chosen: list[Candidate], policy: CompactionPolicy, growth: float) -> list[Candidate]:
    """Of a partition's files (those to fold first, then the rest smallest first), those to fold
    and the smallest of the rest, up to the first file more than `growth` times everything
    before it together: a large file is merged with smaller ones only once they add up to a share
    of its size (those to fold are rewritten anyway, and take every smaller file with them).

    A file too small to make a tier alone (a backfill's one-row piece of a day) does not keep the
    larger files from theirs: the tier starts again at the file that outgrew it, and once that
    tier holds two files, the smaller ones join it (together less than its first file: each was
    outgrown `growth` times over)."""
    below: list[Candidate] = []  # files outgrown while alone
    taken, total = [], 0
    for candidate in chosen:
        size = candidate.file.file_size_in_bytes
        if taken and not policy.folds(candidate) and size > growth * total:
            if len(taken) > 1 or policy.folds(taken[0]):
                break
            below += taken
            taken, total = [], 0
        taken.append(candidate)
        total += size
    return below + taken if len(taken) > 1 or any(map(policy.folds, taken)) else taken
