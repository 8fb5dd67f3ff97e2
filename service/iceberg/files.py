"""The data files a job left behind: finding them (writers), and deleting the ones that will never be
committed (writers and committers both: it lives here, beside the tables, so no role imports another)."""

from __future__ import annotations

import logging

from pyarrow import fs as pafs

log = logging.getLogger(__name__)


def list_data_files(directory: str) -> list[str]:
    """The Parquet files Spark left under `directory`, partition subdirectories included (not
    its checksums or markers); none when the job wrote nothing there."""
    filesystem, path = pafs.FileSystem.from_uri(directory)
    if filesystem.get_file_info(path).type == pafs.FileType.NotFound:
        return []
    infos = filesystem.get_file_info(pafs.FileSelector(path, recursive=True))
    relative = sorted(info.path[len(path):].lstrip("/") for info in infos if info.is_file)
    return [f"{directory}/{name}" for name in relative if name.endswith(".parquet") and not name.rsplit("/", 1)[-1].startswith((".", "_"))]


def delete_files(paths: list[str]) -> None:
    for path in paths:
        try:
            filesystem, location = pafs.FileSystem.from_uri(path)
            filesystem.delete_file(location)
        except OSError:
            log.warning("could not delete orphaned file %s", path)
