"""Who holds an SQLite catalog's write lock: a process frozen inside its catalog write stops every
commit until it runs again, and the committer's warning names it (README, Known limits)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from service.committer.loop import locked_by
from service.core.db import share_sqlite, sqlite_write_lock_holders

HOLD = """
import sqlite3, sys, time
connection = sqlite3.connect(sys.argv[1])
connection.execute("PRAGMA journal_mode=WAL")
connection.execute("UPDATE t SET a = 'held'")  # the write transaction opens here and stays open
print("holding", flush=True)
time.sleep(60)
"""


def test_the_process_inside_its_write_is_named_and_the_committers_warning_says_so(tmp_path: Path) -> None:
    database = tmp_path / "catalog.db"
    url = f"sqlite:///{database}"
    setup = sqlite3.connect(database)
    setup.execute("PRAGMA journal_mode=WAL")
    setup.execute("CREATE TABLE t (a TEXT)")
    setup.execute("INSERT INTO t VALUES ('x')")
    setup.commit()
    assert sqlite_write_lock_holders(url) == []

    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(database)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        os.kill(holder.pid, signal.SIGSTOP)  # frozen inside its write, as a paused VM or SIGSTOP leaves it
        assert sqlite_write_lock_holders(url) == [holder.pid]

        engine = create_engine(url)
        share_sqlite(engine, busy_timeout_ms=100)
        try:
            with engine.begin() as connection:
                connection.execute(text("UPDATE t SET a = 'mine'"))
        except OperationalError as exc:
            locked = exc
        else:
            raise AssertionError("the write went through while another process held the lock")
        said = locked_by(url, locked)  # what the committer adds to its warning
        assert f"held by process {holder.pid}" in said and "stopped inside its catalog write" in said
        assert locked_by(url, OperationalError("SELECT 1", {}, Exception("disk I/O error"))) == ""
    finally:
        os.kill(holder.pid, signal.SIGCONT)
        holder.kill()
        holder.wait()
    assert sqlite_write_lock_holders(url) == [], "the lock goes with the process"
    assert sqlite_write_lock_holders("postgresql://127.0.0.1/test") == []
