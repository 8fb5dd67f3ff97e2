"""One Spark Connect session per process, created on first use."""

from __future__ import annotations

import contextlib
import threading

from pyspark.sql import SparkSession

_lock = threading.Lock()
_sessions: dict[str, SparkSession] = {}


def spark_session(remote: str) -> SparkSession:
    """The Spark Connect session for `remote` (`sc://host:port`), shared within the process."""
    with _lock:
        session = _sessions.get(remote)
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
            _sessions[remote] = session
        return session


def reset_session(remote: str) -> None:
    """Forget a session whose server went away, so the next call reconnects."""
    with _lock:
        session = _sessions.pop(remote, None)
    if session is not None:
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
