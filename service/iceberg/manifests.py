"""The live entries of a table's manifests, read once per process.

A manifest is never rewritten in place (a commit writes new ones and a new manifest list), so its
path names its content for good: what a process read of it stays true. Planning row changes and
checking that a commit's files are still live read every manifest of the current snapshot; with
this they read only the manifests written since the last time.

Kept by weight, not by count: a file of a wide table carries statistics for each of its columns
(a 1,000-column table's file is ~6,000 map entries), so the cache holds at most
MAX_CACHED_STATISTICS of them (plus one per file), least recently used first out.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, ManifestFile

MAX_CACHED_STATISTICS = 1_000_000  # column statistics entries a process keeps (~100 bytes each)
_STATISTICS = ("column_sizes", "value_counts", "null_value_counts", "nan_value_counts", "lower_bounds", "upper_bounds")

_cache: OrderedDict[str, tuple[list[DataFile], list[int | None], int]] = OrderedDict()
_weight = 0
_lock = threading.Lock()


def live_entries(manifest: ManifestFile, io: FileIO) -> list[DataFile]:
    """The files a manifest lists as live (added or existing), read once per process."""
    return _read(manifest, io)[0]


def added_by(manifest: ManifestFile, io: FileIO) -> list[int | None]:
    """The snapshot that added each of `live_entries(manifest, io)`, in the same order (an
    existing entry keeps the snapshot that first added its file)."""
    return _read(manifest, io)[1]


def _read(manifest: ManifestFile, io: FileIO) -> tuple[list[DataFile], list[int | None], int]:
    global _weight  # noqa: PLW0603 - the cache's running total, under _lock
    with _lock:
        cached = _cache.get(manifest.manifest_path)
        if cached is not None:
            _cache.move_to_end(manifest.manifest_path)
            return cached
    entries = manifest.fetch_manifest_entry(io, discard_deleted=True)
    files = [entry.data_file for entry in entries]
    weight = sum(1 + sum(len(getattr(file, name) or {}) for name in _STATISTICS) for file in files)
    read = (files, [entry.snapshot_id for entry in entries], weight)
    with _lock:
        if manifest.manifest_path not in _cache:
            _cache[manifest.manifest_path] = read
            _weight += weight
        while _weight > MAX_CACHED_STATISTICS and len(_cache) > 1:
            _path, (_files, _added, dropped) = _cache.popitem(last=False)
            _weight -= dropped
    return read
