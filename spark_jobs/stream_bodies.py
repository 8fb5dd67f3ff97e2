"""Pointers, not payloads: Spark's tasks read a batch's request bodies from Redis themselves.

Shipped with the job, every body crosses Spark's JVM twice (the Connect server decodes the local
relation, then hands the rows to a Python worker as Arrow) and is garbage there; half of the
JVM's CPU on `make bench`'s load went to that. Instead the job gets each request's input stream
entry id, and each task reads its own entries' bodies with one pipelined XRANGE per entry. The
entries stay in the stream until the writer hands the batch off (acknowledging and deleting
them), so they are there for every attempt of every task.

Spark's executors must reach Calve's Redis at `url` (true for `calve up`, a standalone cluster
beside it, Kubernetes in Redis's network). Where they cannot, the task answers UNREACHABLE and
the writer ships the bodies as before (spark_jobs/pipeline_job.py).
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass

from pyspark import cloudpickle

from spark_jobs.contract import ENTRY_BODY

cloudpickle.register_pickle_by_value(sys.modules[__name__])

# Why a task could not read its bodies: the batch is written with its bodies shipped instead.
UNREACHABLE = "Spark's tasks could not read the bodies from Redis"
# Of those, an entry no longer in the stream: another writer took the batch over (its writer
# looked dead) and handed it off. Redis answers; nothing is turned off for it.
GONE = "an entry of the input stream is gone"
CONNECT_TIMEOUT_S = 2.0  # an executor that cannot reach Redis says so within this


@dataclass(frozen=True)
class StreamEntries:
    """Where the bodies of a batch's requests are: their entries of one input stream. `url` is a
    redis:// or rediss:// URL as Spark's executors reach it (a Sentinel's master resolved by the
    writer), with its password: it travels inside the job, never into a log."""

    url: str
    cluster: bool
    stream: str
    ids: tuple[str, ...]

    def __repr__(self) -> str:  # the URL holds the password
        return f"StreamEntries(stream={self.stream!r}, {len(self.ids)} ids)"


class BodiesUnreachable(Exception):
    """Redis could not be asked, or an entry was gone."""


def read_bodies(url: str, cluster: bool, stream: str, ids: list[str]) -> list[bytes]:
    """The bodies of the entries `ids` of `stream`, in their order, through a client this Spark
    Python worker keeps for the tasks it runs after this one (PySpark reuses its workers)."""
    import redis

    try:
        client = _client(url, cluster)
        pipe = client.pipeline(transaction=False)
        for entry_id in ids:
            pipe.xrange(stream, entry_id, entry_id)
        found = pipe.execute()
    except redis.RedisError as exc:
        _forget(url, cluster)
        raise BodiesUnreachable(f"{exc.__class__.__name__}: {str(exc)[:200]}") from exc
    bodies = []
    for entry_id, entries in zip(ids, found):
        if not entries:
            raise BodiesUnreachable(f"{GONE}: {entry_id}")
        bodies.append(entries[0][1][ENTRY_BODY.encode()])
    return bodies


def _clients() -> dict:
    # On a module of its own in sys.modules: this module comes by value with each task, its
    # globals anew each time (as files.cached_read keeps its tables).
    state = sys.modules.get("calve_worker_redis")
    if state is None:
        state = sys.modules["calve_worker_redis"] = types.ModuleType("calve_worker_redis")
        state.clients = {}
    return state.clients


def _client(url: str, cluster: bool):  # noqa: ANN202 - redis.Redis or RedisCluster
    clients = _clients()
    client = clients.get((url, cluster))
    if client is None:
        import redis
        from redis.cluster import RedisCluster

        options = {"socket_connect_timeout": CONNECT_TIMEOUT_S, "socket_timeout": 30.0}
        client = RedisCluster.from_url(url, **options) if cluster else redis.Redis.from_url(url, **options)
        clients[(url, cluster)] = client
    return client


def _forget(url: str, cluster: bool) -> None:
    client = _clients().pop((url, cluster), None)
    if client is not None:
        try:
            client.close()
        except Exception:  # noqa: BLE001, S110 - a broken client is dropped whatever it says
            pass
