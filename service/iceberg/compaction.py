"""Which files to compact: per partition, small files bin-packed toward the table's target file
size, and (merge-on-read) files with many rows deleted, rewritten with their deletes applied.

Scheduled compactions merge small files by size tier: a partition's smallest files together, a
larger file joining them only once the smaller ones add up to half its size (TIER_GROWTH). A partition that takes a
small file per change run (or per writer batch) beside one large file of its earlier rows then
merges the new files among themselves, not into the large file every time: each row is copied
a few times (once per doubling), not once per compaction. A compaction asked for by hand takes
every small file of a partition.

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
from service.iceberg.rewrites import deletes_by_file, live_files, referenced_data_file

TARGET_FILE_SIZE_PROPERTY = "write.target-file-size-bytes"
SMALL_FILE_RATIO = 0.75  # a file below this share of the target is small (Iceberg's bin-pack default)
TIER_GROWTH = 2  # a file joins smaller ones being merged when it is at most this many times their size


@dataclass(frozen=True)
class CompactionPolicy:
    """When a partition is compacted: it holds at least `min_files` small files, or small files
    adding up to a whole target file, or a file whose position deletes delete `deleted_share` of
    its rows or number `delete_files` (folded in, whatever its size); a request rewrites at most
    `max_bytes` (one Spark job's worth)."""

    target_file_bytes: int
    min_files: int
    max_bytes: int
    deleted_share: float = 0.3
    delete_files: int = 10
    tiered: bool = True  # small files merged by size tier (else every small file of a partition)

    @classmethod
    def from_settings(cls, settings: Settings) -> CompactionPolicy:
        return cls(settings.compact_target_file_bytes, settings.compact_min_files, settings.compact_max_bytes,
                   settings.compact_deleted_share, settings.compact_delete_files)

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
    """The live data files a compaction may rewrite, each with its delete files: all but those a
    delete file without file_path bounds may apply to (another engine's, scoped to a partition;
    or an equality delete), which a rewrite could not account for row by row."""
    data, deletes = live_files(table)
    applying = deletes_by_file(data, deletes)
    return [
        Candidate(file, applying.get(path, []))
        for path, file in data.items()
        if all(referenced_data_file(delete) == path for delete in applying.get(path, []))
    ]


def plan_compaction(candidates: Iterable[Candidate], policy: CompactionPolicy, spec_id: int = 0) -> list[CompactionGroup]:
    """The partitions worth compacting now, those with files to fold deletes into first, then
    most small files first, within `policy.max_bytes`. Only files of the table's current
    partition spec (`spec_id`): a file of an older spec may span several of today's partitions."""
    small_limit = policy.target_file_bytes * SMALL_FILE_RATIO
    by_partition: dict[tuple, list[Candidate]] = defaultdict(list)
    for candidate in candidates:
        file = candidate.file
        if file.spec_id == spec_id and (file.file_size_in_bytes < small_limit or policy.folds(candidate)):
            by_partition[(file.spec_id, file.partition)].append(candidate)
    groups, planned = [], 0
    ordered = sorted(by_partition.values(), key=lambda chosen: (any(policy.folds(c) for c in chosen), len(chosen)), reverse=True)
    for chosen in ordered:
        folding = any(policy.folds(candidate) for candidate in chosen)
        # Files to fold first, then the rest, smallest first; the same choice every time for the same files.
        chosen.sort(key=lambda candidate: (not policy.folds(candidate), candidate.file.file_size_in_bytes, candidate.file.file_path))
        if policy.tiered:
            chosen = _tier(chosen, policy)
        if not folding:
            total = sum(candidate.file.file_size_in_bytes for candidate in chosen)
            if len(chosen) < 2 or (len(chosen) < policy.min_files and total < policy.target_file_bytes):
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
        groups.append(CompactionGroup(taken, max(1, math.ceil(kept / policy.target_file_bytes))))
        planned += size
        if planned >= policy.max_bytes:
            break
    return groups


def _tier(chosen: list[Candidate], policy: CompactionPolicy) -> list[Candidate]:
    """Of a partition's files (those to fold first, then the rest smallest first), those to fold
    and the smallest of the rest, up to the first file more than TIER_GROWTH times everything
    before it together: a large file is merged with smaller ones only once they add up to a share
    of its size (those to fold are rewritten anyway, and take every smaller file with them)."""
    taken, total = [], 0
    for candidate in chosen:
        size = candidate.file.file_size_in_bytes
        if taken and not policy.folds(candidate) and size > TIER_GROWTH * total:
            break
        taken.append(candidate)
        total += size
    return taken
