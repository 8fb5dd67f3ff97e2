"""One Spark Connect session per process and purpose, created on first use."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from pyspark.sql import SparkSession

_lock = threading.Lock()
_sessions: dict[tuple[str, str], SparkSession] = {}
# What sets how many tasks a stage of a job runs: its shuffles' partitions, and the splits of the
# files it reads (Spark's suggestion, which it rescales the splits to; a file is not cut finer).
_TASKS_CONFS = ("spark.sql.shuffle.partitions", "spark.sql.files.maxPartitionNum")


# The session of a writer's compactions, which run on a thread of their own beside its batches
# (service/writer/loop.py): tasks_at_most changes its session's settings while a compaction runs,
# and the batches' jobs on the other thread must not run under them.
UPKEEP = "upkeep"


def spark_session(remote: str, purpose: str = "") -> SparkSession:
    """The Spark Connect session for `remote` (`sc://host:port`), shared within the process by
    the callers of one `purpose` (each thread whose jobs change session settings has its own)."""
    with _lock:
        session = _sessions.get((remote, purpose))
        if session is None:
            # create(), not getOrCreate(): the latter answers pyspark's default session whatever
            # its remote, and one a caller had closed (a test once got another's closed session).
            session = SparkSession.builder.remote(remote).create()
            # Partition values and epoch conversions are UTC, as Iceberg defines them; and a pipeline
            # expression that fails on one event (a bad cast, a division by zero) gives NULL for
            # that event instead of failing the whole batch.
            session.conf.set("spark.sql.session.timeZone", "UTC")
            session.conf.set("spark.sql.ansi.enabled", "false")
            # Iceberg `time` columns: Spark 4.1+ has TIME behind this flag (older servers ignore it).
            session.conf.set("spark.sql.timeType.enabled", "true")
            # Field names are matched exactly, as Iceberg and JSON match them: `Msg` and `msg` in
            # one event (or one batch) are two fields, not an ambiguous reference failing the job.
            session.conf.set("spark.sql.caseSensitive", "true")
            # A key twice in one object read as a map keeps its last value, as a field twice in an
            # event does, instead of failing the whole batch when the map is rebuilt in key order.
            session.conf.set("spark.sql.mapKeyDedupPolicy", "LAST_WIN")
            _sessions[remote, purpose] = session
        return session


@contextlib.contextmanager
def tasks_at_most(spark: SparkSession, tasks: int | None) -> Iterator[None]:
    """The session's jobs meanwhile run at most `tasks` tasks at a time (None: as the server's
    settings say): Spark runs one application's jobs first come, first served, so one job's
    stages of as many tasks as cores leave every other writer's jobs waiting until they end.
    For one thread's jobs only: the settings are the session's, and put back after."""
    if tasks is None:
        yield
        return
    before = {name: spark.conf.get(name, None) for name in _TASKS_CONFS}
    for name in _TASKS_CONFS:
        spark.conf.set(name, str(tasks))
    try:
        yield
    finally:
        for name, value in before.items():
            with contextlib.suppress(Exception):  # the server may be gone: a new session starts from its settings
                if value is None:
                    spark.conf.unset(name)
                else:
                    spark.conf.set(name, value)


def reset_session(remote: str, purpose: str | None = None) -> None:
    """Forget the sessions of a server that went away (`purpose`'s, None: every purpose's), so
    the next call reconnects."""
    with _lock:
        sessions = [_sessions.pop(key) for key in list(_sessions) if key[0] == remote and purpose in (None, key[1])]
    for session in sessions:
        _close(session)


def close_sessions() -> None:
    """Close every session's channel, without asking the server to release it.

    `SparkSession.stop()`, and the client's own exit hook, send a release RPC and retry it while
    the server is unreachable: a writer stopping together with its Spark server (as `calve up`
    does on Ctrl-C) hung for a minute at exit. The server drops idle sessions by itself.
    """
    with _lock:
        sessions = list(_sessions.values())
        _sessions.clear()
    for session in sessions:
        _close(session)


def _close(session: SparkSession) -> None:
    # The server may be gone already: nothing to release then.
    with contextlib.suppress(Exception):
        session.client.close()  # marks the client closed: its exit hook then sends nothing
