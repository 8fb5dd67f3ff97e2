"""Redis clients for every role: one Redis server, a Redis Cluster (`CALVE_REDIS_CLUSTER`), or the
master that Redis Sentinel names (`CALVE_REDIS_URL=redis+sentinel://host:26379,host2:26379/mymaster`:
each new connection asks the sentinels which server is the master now, so after a failover the
roles reconnect to the promoted replica).

What makes Calve safe on a cluster (and is kept so by tests/integration/test_redis_cluster.py):
- every key of one tenant carries the hash tag `{tenant}` (service/core/keys.py), so every Lua
  script and every MULTI/EXEC touches keys of one tenant only, in one slot; the registries and
  work queues shared by all tenants (`calve:tables`, `calve:applies`, ...) are never in a
  transaction or script with a tenant's key: they are written after it, in an order that makes
  a crash between the two steps harmless (the work is found again, or asked again after its
  timeout);
- the writer reads the input streams of one tenant per XREADGROUP (service/writer/loop.py);
- pub/sub is classic PUBLISH/SUBSCRIBE, which a cluster delivers to subscribers on every node.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from urllib.parse import quote, unquote

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.cluster import RedisCluster
from redis.sentinel import Sentinel

from service.core.config import Settings

SENTINEL_SCHEME = "redis+sentinel://"
SENTINEL_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class SentinelURL:
    """`redis+sentinel://[[user]:password@]host:port[,host:port...]/master-name[/db]`; the
    password is the master's (sentinels themselves are asked without one)."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = None

    @classmethod
    def parse(cls, url: str) -> SentinelURL:
        rest = url.removeprefix(SENTINEL_SCHEME)
        auth, _, rest = rest.rpartition("@")
        hosts, _, path = rest.partition("/")
        master, _, db = path.strip("/").partition("/")
        if not hosts or not master:
            raise ValueError(f"a Sentinel URL names its sentinels and master: {SENTINEL_SCHEME}host:26379[,host:26379]/mymaster[/db]")
        sentinels = []
        for host in hosts.split(","):
            name, _, port = host.rpartition(":")
            sentinels.append((name or host, int(port) if name else 26379))
        username, _, password = auth.rpartition(":") if ":" in auth else ("", "", auth)
        return cls(tuple(sentinels), master, int(db or 0), unquote(username) or None, unquote(password) or None)


def redis_client(settings: Settings, **options: object) -> redis.Redis:
    """A synchronous client of `settings.redis_url` (any node of it, for a cluster)."""
    return client_for_url(settings.redis_url, cluster=settings.redis_cluster, **options)


def tasks_redis_url(settings: Settings) -> str:
    """The URL Spark's tasks reach Redis at (spark_jobs/stream_bodies.py): spark_redis_url, or
    redis_url; behind Sentinel, the master it names now, as a plain URL."""
    url = settings.spark_redis_url or settings.redis_url
    if not url.startswith(SENTINEL_SCHEME):
        return url
    named = SentinelURL.parse(url)
    host, port = _sentinel(named.sentinels).discover_master(named.master)
    auth = f"{quote(named.username or '', safe='')}:{quote(named.password, safe='')}@" if named.password else ""
    return f"redis://{auth}{host}:{port}/{named.db}"


@functools.lru_cache(maxsize=4)
def _sentinel(sentinels: tuple[tuple[str, int], ...]) -> Sentinel:
    """The sentinels asked for the master before each batch (tasks_redis_url): kept, with their
    connections, so a batch costs one question, not new connections too."""
    return Sentinel(list(sentinels), socket_timeout=SENTINEL_TIMEOUT_S)


def client_for_url(url: str, cluster: bool = False, **options: object) -> redis.Redis:
    if url.startswith(SENTINEL_SCHEME):
        named = SentinelURL.parse(url)
        sentinel = Sentinel(list(named.sentinels), socket_timeout=SENTINEL_TIMEOUT_S)
        return sentinel.master_for(named.master, db=named.db, username=named.username, password=named.password, **options)
    if cluster:
        return RedisCluster.from_url(url, **options)
    return redis.Redis.from_url(url, **options)


def async_redis_client(settings: Settings) -> aioredis.Redis:
    """The api's client: at most `redis_max_connections` connections (per node, for a cluster);
    with one server, a request beyond them waits for one instead of failing."""
    if settings.redis_url.startswith(SENTINEL_SCHEME):
        named = SentinelURL.parse(settings.redis_url)
        sentinel = AsyncSentinel(list(named.sentinels), socket_timeout=SENTINEL_TIMEOUT_S)
        return sentinel.master_for(named.master, db=named.db, username=named.username, password=named.password,
                                   max_connections=settings.redis_max_connections)
    if settings.redis_cluster:
        return AsyncRedisCluster.from_url(settings.redis_url, max_connections=settings.redis_max_connections)
    pool = aioredis.BlockingConnectionPool.from_url(settings.redis_url, max_connections=settings.redis_max_connections, timeout=10)
    return aioredis.Redis(connection_pool=pool)


def redis_error_code(exc: BaseException) -> str | None:
    """The error code a Redis server answered with (NOGROUP, BUSYGROUP, ...): redis-py raises one
    ResponseError for them all, the code its message's first word."""
    if not isinstance(exc, redis.ResponseError):
        return None
    words = str(exc).split(maxsplit=1)
    return words[0] if words else None
