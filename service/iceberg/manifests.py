"""The live entries of a table's manifests, read once per process.

A manifest is never rewritten in place (a commit writes new ones and a new manifest list), so its
path names its content for good: what a process read of it stays true. Planning row changes and
checking that a commit's files are still live read every manifest of the current snapshot; with
this they read only the manifests written since the last time.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile, ManifestFile

MANIFESTS_CACHED = 4096  # manifests whose live entries a process keeps (a few KB per file listed)

_cache: OrderedDict[str, list[DataFile]] = OrderedDict()
_lock = threading.Lock()


def live_entries(manifest: ManifestFile, io: FileIO) -> list[DataFile]:
    """The files a manifest lists as live (added or existing), read once per process."""
    with _lock:
        files = _cache.get(manifest.manifest_path)
        if files is not None:
            _cache.move_to_end(manifest.manifest_path)
            return files
    files = [entry.data_file for entry in manifest.fetch_manifest_entry(io, discard_deleted=True)]
    with _lock:
        _cache[manifest.manifest_path] = files
        while len(_cache) > MANIFESTS_CACHED:
            _cache.popitem(last=False)
    return files
