"""The metadata database: engine, sessions and migrations."""

from __future__ import annotations

import os
import sqlite3
from functools import lru_cache
from pathlib import Path

from alembic.config import Config
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlmodel import create_engine

from alembic import command

ALEMBIC_DIR = Path(__file__).resolve().parents[2] / "alembic"


@lru_cache(maxsize=4)
def get_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        share_sqlite(engine, busy_timeout_ms=30_000)
        return engine
    return create_engine(url, pool_pre_ping=True)


def share_sqlite(engine: Engine, busy_timeout_ms: int) -> None:
    """Set up an SQLite engine for a file several processes share (the metadata DB, the embedded
    catalog): WAL lets readers go on while one writes, and a busy timeout turns lock contention
    into short waits instead of "database is locked" failures."""

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_connection: sqlite3.Connection, _record: object) -> None:
        cursor = dbapi_connection.cursor()
        # The timeout first: switching to WAL takes a lock, and without it a connection opened while
        # another holds one fails at once ("database is locked": seen with 8 writers starting together).
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.close()


def sqlite_write_lock_holders(url: str) -> list[int]:
    """The processes holding the write lock of the SQLite database at `url` (in WAL mode: a POSIX
    lock on byte 120 of its -shm file, WALINDEX_LOCK_OFFSET), as Linux's /proc/locks lists them;
    [] when none does, or where that cannot be known (another system, another database)."""
    if not url.startswith("sqlite:///"):
        return []
    try:
        inode = os.stat(url.removeprefix("sqlite:///") + "-shm").st_ino
        rows = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return []
    holders = []
    for row in rows:
        # "9: POSIX  ADVISORY  WRITE 13964 fe:00:2147740 120 120"; a waiter's has "->" after the number
        fields = row.split()
        if fields[1:4] == ["POSIX", "ADVISORY", "WRITE"] and fields[5].endswith(f":{inode}") and fields[6] == "120":
            holders.append(int(fields[4]))
    return holders


def migrate(url: str) -> None:
    """Bring the metadata DB to the newest schema (`alembic upgrade head`)."""
    config = Config()
    config.set_main_option("script_location", str(ALEMBIC_DIR))
    config.set_main_option("sqlalchemy.url", url)
    config.attributes["configure_logger"] = False
    command.upgrade(config, "head")
