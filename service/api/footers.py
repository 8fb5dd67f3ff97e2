"""Registered files' footers, read and checked in processes of their own, not in the api's.

Checking a file is mostly Python (pyiceberg's statistics of every column, the partition value,
the description the leader commits): on threads of the api process it holds the interpreter lock
the api answers every tenant with. A profile of the api while one tenant registered 8,000 files
in 1,000-file calls put ~77% of its samples in those checks. So a call of more than IN_PROCESS
files is checked in `processes` worker processes (spawned, niced so the api and the other roles
come first), each reading its files' footers on threads of its own (an object store answers each
in tens of ms); a worker keeps the tables' metadata it read (by metadata file) and one FileIO per
set of properties. A call of a few files (a webhook's notification: one) is checked on the api's
own footer threads, as the hop to a worker would cost it more than it saves: `make bench-files`
measured one-file calls at 165-228 files/s through the workers against 221-254 on threads, and
1,000-file calls at 1,164-1,263 files/s against 793-1,007 (100-file calls varied too much to say).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import threading
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

from pyiceberg.table import Table

log = logging.getLogger(__name__)

CHUNK = 25  # files per task: a call's files spread over the workers, few round trips
IN_PROCESS = 4  # a call of at most this many files is checked on the api's footer threads
WORKER_THREADS = 8  # footers read at once per worker process
NICENESS = 10


@dataclass(frozen=True)
class Checked:
    """One file's check: accepted (rows, bytes, described) or refused (reason, detail)."""

    path: str
    reason: str | None = None
    detail: str | None = None
    rows: int | None = None
    bytes: int | None = None
    described: dict | None = None


@dataclass(frozen=True)
class TableRef:
    """What a worker needs of the table: where its metadata file is, and how to read files."""

    metadata_location: str
    location: str
    io_properties: dict[str, str]


class FooterReaders:
    """The pool, started on first use; `check` answers one call's files."""

    def __init__(self, processes: int, max_footer_bytes: int) -> None:
        self.processes = processes
        self.max_footer_bytes = max_footer_bytes
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        # Not the api's shared pool: a tenant registering files must not take the threads every
        # tenant's ingest parses its bodies on.
        self._threads = ThreadPoolExecutor(WORKER_THREADS, thread_name_prefix="footers")

    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(self.processes, mp_context=multiprocessing.get_context("spawn"), initializer=_start_worker)
            return self._pool

    def _restart(self, broken: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._pool is broken:
                self._pool = None
        broken.shutdown(wait=False, cancel_futures=True)

    async def check(self, table: Table, files: list[tuple[str, int | None]]) -> list[Checked]:
        """Each of `files` (path, announced size) checked against the table, in their order. A
        worker that died is replaced and the call's files are checked once more; if the workers
        still cannot check them, the api's threads do."""
        loop = asyncio.get_running_loop()
        if len(files) > IN_PROCESS:
            ref = TableRef(table.metadata_location, table.location(), dict(table.io.properties))
            chunks = [files[i:i + CHUNK] for i in range(0, len(files), CHUNK)]
            for _attempt in range(2):
                pool = self._executor()
                try:
                    done = await asyncio.gather(*(loop.run_in_executor(pool, check_files, ref, chunk, self.max_footer_bytes) for chunk in chunks))
                    return [checked for chunk in done for checked in chunk]
                except BrokenProcessPool:
                    self._restart(pool)  # then once more on a new worker
                except Exception as exc:  # noqa: BLE001 - the workers could not check (the metadata file gone): here, then
                    log.warning("registration: the footer workers failed (%s: %s); checking on the api's threads", exc.__class__.__name__, exc)
                    break
        checks = [loop.run_in_executor(self._threads, _check, table.metadata, table.io, path, size, self.max_footer_bytes) for path, size in files]
        return list(await asyncio.gather(*checks))

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        self._threads.shutdown(wait=False, cancel_futures=True)


# -- in the worker processes ------------------------------------------------------------------

_state: dict = {}


def _start_worker() -> None:
    with contextlib.suppress(OSError):
        os.nice(NICENESS)
    _init_state()


def _init_state() -> None:
    _state.update(metadata={}, io={}, threads=ThreadPoolExecutor(WORKER_THREADS, thread_name_prefix="footers"), lock=threading.Lock())


def _table(ref: TableRef):  # noqa: ANN202 - (TableMetadata, FileIO)
    from pyiceberg.io import load_file_io
    from pyiceberg.serializers import FromInputFile

    with _state["lock"]:
        io_key = tuple(sorted(ref.io_properties.items()))
        io = _state["io"].get(io_key)
        if io is None:
            io = _state["io"][io_key] = load_file_io(ref.io_properties, ref.location)
        metadata = _state["metadata"].get(ref.metadata_location)
    if metadata is None:
        metadata = FromInputFile.table_metadata(io.new_input(ref.metadata_location))
        with _state["lock"]:
            if len(_state["metadata"]) >= 64:
                _state["metadata"].clear()
            _state["metadata"][ref.metadata_location] = metadata
    return metadata, io


def check_files(ref: TableRef, files: list[tuple[str, int | None]], max_footer_bytes: int) -> list[Checked]:
    """In a worker: each file's footer read and checked (registration.registered_data_file)."""
    if not _state:  # called outside a worker (a test): the same, not niced
        _init_state()
    metadata, io = _table(ref)
    return list(_state["threads"].map(lambda file: _check(metadata, io, file[0], file[1], max_footer_bytes), files))


def _check(metadata, io, path: str, size: int | None, max_footer_bytes: int) -> Checked:  # noqa: ANN001
    from service.iceberg.registration import FileRefused, describe, registered_data_file

    try:
        data_file = registered_data_file(metadata, io, path, max_footer_bytes, size)
    except FileRefused as exc:
        return Checked(path, exc.reason, str(exc))
    except Exception as exc:  # noqa: BLE001 - a file the store or pyarrow cannot read: refused with what it said
        return Checked(path, "unreadable", f"{path}: {exc}"[:1000])
    return Checked(path, rows=data_file.record_count, bytes=data_file.file_size_in_bytes,
                   described=describe(data_file, metadata.current_schema_id))
