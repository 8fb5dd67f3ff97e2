"""The last run of each upkeep task of a table, kept for its health (GET /v1/tables/{name})."""

from __future__ import annotations

import time

import orjson
import redis

from service.core import keys


def record_upkeep(client: redis.Redis, tenant: str, table: str, task: str, outcome: dict) -> None:
    client.hset(keys.upkeep_key(tenant, table), task, orjson.dumps(outcome | {"at_ms": int(time.time() * 1000)}))
