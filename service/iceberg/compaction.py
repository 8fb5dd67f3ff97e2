"""Which small files to compact: per partition, bin-packed toward the table's target file size.

Planning reads only table metadata (file sizes and partitions); the rewrite itself runs on Spark
(spark_jobs/compact_job.py, submitted by a writer) and is committed as a `replace` snapshot by the
table's leader (rewrites.py). The target is the table's `write.target-file-size-bytes`, Iceberg's
own property, which Calve sets from a sink's `target_file_size`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from pyiceberg.manifest import DataFile
from pyiceberg.table import Table

from service.core.config import Settings
from service.iceberg.rewrites import live_files, with_deletes

TARGET_FILE_SIZE_PROPERTY = "write.target-file-size-bytes"
SMALL_FILE_RATIO = 0.75  # a file below this share of the target is small (Iceberg's bin-pack default)


@dataclass(frozen=True)
class CompactionPolicy:
    """When a partition is compacted: it holds at least `min_files` small files, or small files
    adding up to a whole target file; a request rewrites at most `max_bytes` (one Spark job's worth)."""

    target_file_bytes: int
    min_files: int
    max_bytes: int

    @classmethod
    def from_settings(cls, settings: Settings) -> CompactionPolicy:
        return cls(settings.compact_target_file_bytes, settings.compact_min_files, settings.compact_max_bytes)

    def for_table(self, table: Table) -> CompactionPolicy:
        own = table.properties.get(TARGET_FILE_SIZE_PROPERTY)
        if own and own.isdigit() and int(own) > 0:
            return CompactionPolicy(int(own), self.min_files, self.max_bytes)
        return self


@dataclass(frozen=True)
class CompactionGroup:
    """Small files of one partition, rewritten into `outputs` files."""

    files: list[DataFile]
    outputs: int

    @property
    def bytes(self) -> int:
        return sum(file.file_size_in_bytes for file in self.files)


def compactable(table: Table) -> list[DataFile]:
    """The live data files a compaction may rewrite: those without delete files (it reads files
    whole; folding deletes in is for a later compaction that applies them)."""
    data, deletes = live_files(table)
    deleted = with_deletes(data, deletes)
    return [file for path, file in data.items() if path not in deleted]


def plan_compaction(files: Iterable[DataFile], policy: CompactionPolicy, spec_id: int = 0) -> list[CompactionGroup]:
    """The partitions worth compacting now, most small files first, within `policy.max_bytes`.
    Only files of the table's current partition spec (`spec_id`): a file of an older spec may
    span several of today's partitions."""
    small_limit = policy.target_file_bytes * SMALL_FILE_RATIO
    by_partition: dict[tuple, list[DataFile]] = defaultdict(list)
    for file in files:
        if file.file_size_in_bytes < small_limit and file.spec_id == spec_id:
            by_partition[(file.spec_id, file.partition)].append(file)
    groups, planned = [], 0
    for small in sorted(by_partition.values(), key=len, reverse=True):
        if len(small) < 2:
            continue
        total = sum(file.file_size_in_bytes for file in small)
        if len(small) < policy.min_files and total < policy.target_file_bytes:
            continue
        small.sort(key=lambda file: file.file_path)  # the same choice every time for the same files
        chosen, size = [], 0
        for file in small:
            if chosen and planned + size + file.file_size_in_bytes > policy.max_bytes:
                break
            chosen.append(file)
            size += file.file_size_in_bytes
        if len(chosen) < 2:
            break
        groups.append(CompactionGroup(chosen, max(1, math.ceil(size / policy.target_file_bytes))))
        planned += size
        if planned >= policy.max_bytes:
            break
    return groups
