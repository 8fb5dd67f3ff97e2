"""Carrying row deletes over to a compaction's files: rows of a file being rewritten that a row
change deleted after the compaction was planned are deleted from the copy too, at commit.

A merge-on-read table under a steady change stream gets new delete files for the files a
compaction is rewriting while it runs (every change run adds one per file it hits). Refusing the
compaction then would refuse it every time; instead the leader maps each newly deleted row to its
place in the copy, which the copy's layout (spark_jobs/contract.layout_path) gives: a source's
row at position p is, in its copy, at `start + p - (positions of it left out before p)`. The
mapped positions are written as position delete files of the copies, committed in the same
`replace` snapshot that removes the sources and their delete files.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.manifest import DataFile

from service.core.exceptions import FilesNotLive
from spark_jobs.contract import POSITION_DELETE_ARROW, layout_path

MAX_CARRIED_DELETE_FILES = 2_000  # read by the leader at commit: beyond this the compaction is dropped


def deleted_positions(io: FileIO, source: str, deletes: list[DataFile] | tuple[DataFile, ...]) -> np.ndarray:
    """The row positions of data file `source` that the position delete files `deletes` name,
    sorted, once each (a delete file may name other files too: another engine's)."""
    positions = [np.empty(0, np.int64)]
    for delete in deletes:
        with io.new_input(delete.file_path).open() as stream:
            table = pq.read_table(stream, columns=["file_path", "pos"])
        positions.append(table.filter(pc.equal(table.column("file_path"), source)).column("pos").to_numpy())
    return np.unique(np.concatenate(positions).astype(np.int64, copy=False))


def read_layouts(io: FileIO, copies: list[str]) -> dict[str, tuple[str, int, int, np.ndarray]]:
    """Per source file, (its copy, its first row's place there, rows it gave, positions left out),
    from the copies' layouts. FilesNotLive when a copy has none (Spark's fallback writer wrote it)."""
    layouts = {}
    for copy in copies:
        try:
            with io.new_input(layout_path(copy)).open() as stream:
                layout = json.loads(stream.read())
        except FileNotFoundError as exc:
            raise FilesNotLive(f"rows of the files rewritten were deleted meanwhile, and {copy} has no layout to carry them over") from exc
        for source, start, rows, folded in layout:
            layouts[source] = (copy, int(start), int(rows), np.asarray(folded, dtype=np.int64))
    return layouts


def carry_over(
    io: FileIO, directory: str, new_deletes: dict[str, list[DataFile]], layouts: dict[str, tuple[str, int, int, np.ndarray]],
) -> list[tuple[str, str, int, int]]:
    """Position delete files under `directory` deleting from the copies the rows `new_deletes` (per
    source file, delete files committed after its copy was planned) delete from their sources,
    placed by the copies' `layouts` (read_layouts); each as (path, the copy it applies to, rows,
    bytes)."""
    count = sum(map(len, new_deletes.values()))
    if count > MAX_CARRIED_DELETE_FILES:
        raise FilesNotLive(f"rows of the files rewritten were deleted meanwhile by {count} delete files, more than are carried over at commit")
    mapped: dict[str, list[np.ndarray]] = {}
    for source, deletes in new_deletes.items():
        if source not in layouts:
            raise FilesNotLive(f"rows of {source} were deleted meanwhile, and no copy's layout names it")
        copy, start, rows, folded = layouts[source]
        deleted = np.setdiff1d(deleted_positions(io, source, deletes), folded)  # those folded in are gone already
        placed = start + deleted - np.searchsorted(folded, deleted)
        if len(placed) and (placed[0] < start or placed[-1] >= start + rows):
            raise FilesNotLive(f"a position deleted from {source} lies outside the rows it gave its copy")
        mapped.setdefault(copy, []).append(placed)
    written = []
    for number, (copy, parts) in enumerate(sorted(mapped.items())):
        positions = np.sort(np.concatenate(parts))
        if not len(positions):
            continue
        path = f"{directory}/deletes-{number:05d}.zstd.parquet"
        with io.new_output(path).create(overwrite=True) as stream:
            pq.write_table(pa.table({"file_path": [copy] * len(positions), "pos": positions}, POSITION_DELETE_ARROW), stream, compression="zstd")
        written.append((path, copy, len(positions), len(io.new_input(path))))
    return written
