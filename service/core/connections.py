"""Redis clients for every role: one Redis server, or a Redis Cluster (`CALVE_REDIS_CLUSTER`).

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

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from service.core.config import Settings


def redis_client(settings: Settings, **options: object) -> redis.Redis:
    """A synchronous client of `settings.redis_url` (any node of it, for a cluster)."""
    if settings.redis_cluster:
        return RedisCluster.from_url(settings.redis_url, **options)
    return redis.Redis.from_url(settings.redis_url, **options)


def async_redis_client(settings: Settings) -> aioredis.Redis:
    """The api's client: at most `redis_max_connections` connections (per node, for a cluster);
    with one server, a request beyond them waits for one instead of failing."""
    if settings.redis_cluster:
        return AsyncRedisCluster.from_url(settings.redis_url, max_connections=settings.redis_max_connections)
    pool = aioredis.BlockingConnectionPool.from_url(settings.redis_url, max_connections=settings.redis_max_connections, timeout=10)
    return aioredis.Redis(connection_pool=pool)
