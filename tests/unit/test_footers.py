"""Registered files' footers are checked in worker processes of their own (service/api/footers.py),
a call of a few files on the api's threads: the same answers either way, and a worker killed
meanwhile is replaced.

A real pyiceberg table (SQLite catalog), real Parquet files and real worker processes."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField, StringType

from service.api.footers import IN_PROCESS, FooterReaders
from service.core.config import Settings
from service.iceberg.catalog import open_catalog


def test_footers_are_checked_in_worker_processes_that_are_replaced_when_killed(tmp_path: Path) -> None:
    catalog = open_catalog(Settings(data_dir=tmp_path))
    catalog.create_namespace_if_not_exists("demo")
    table = catalog.create_table(("demo", "landed"), Schema(NestedField(1, "id", LongType()), NestedField(2, "name", StringType())))
    data = Path(table.location().removeprefix("file://")) / "data"
    data.mkdir(parents=True)
    pq.write_table(pa.table({"id": pa.array([1, 2, 3], pa.int64()), "name": ["a", "b", "c"]}), data / "good.parquet")
    (data / "fake.parquet").write_text("id,name\n1,a\n")
    names = ["good.parquet", "fake.parquet", "missing.parquet", *(f"copy{i}.parquet" for i in range(IN_PROCESS))]
    for name in names[3:]:
        shutil.copy(data / "good.parquet", data / name)
    files = [((data / name).as_uri(), None) for name in names]
    readers = FooterReaders(processes=1, max_footer_bytes=1 << 20)
    try:
        checked = asyncio.run(readers.check(table, files))  # more than IN_PROCESS: in a worker
        good, fake, missing, *copies = checked
        assert (good.reason, good.rows, good.bytes) == (None, 3, (data / "good.parquet").stat().st_size)
        assert good.described is not None and good.described["rows"] == 3, "described for the leader to commit without reading it"
        assert (fake.reason, missing.reason) == ("not_parquet", "not_found")
        assert [c.rows for c in copies] == [3] * IN_PROCESS and [c.path for c in checked] == [path for path, _ in files]
        (worker,) = readers._pool._processes.values()  # the one worker, to kill
        assert worker.pid != os.getpid()
        small = [asyncio.run(readers.check(table, [file]))[0] for file in files[:3]]  # a few: on the api's threads
        assert small == checked[:3], "the same answers either way"
        os.kill(worker.pid, signal.SIGKILL)
        worker.join(10)
        again = asyncio.run(readers.check(table, files))
        assert again == checked
        (replaced,) = readers._pool._processes.values()
        assert replaced.pid != worker.pid, "a new worker answered the next call"
    finally:
        readers.close()
