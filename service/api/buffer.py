"""Accepting a request into Redis: receipt, input entry and backlog in one atomic step.

With an idempotency key, only the first request holding it gets in; a retry learns the first
request's receipt instead. Every key is in the tenant's hash slot, so the script stays atomic on a
Redis Cluster too.
"""

from __future__ import annotations

import time

import orjson
import redis.asyncio as aioredis

from service.api.events import ParsedBody
from service.core import keys
from service.core.config import Settings
from service.protocol import scripts


class RequestBuffer:
    def __init__(self, client: aioredis.Redis, settings: Settings) -> None:
        self._client = client
        self._settings = settings
        self._buffer = client.register_script(scripts.BUFFER)

    async def first_receipt(self, tenant: str, idempotency: str) -> str | None:
        """The receipt of the request that already used this idempotency key, if one did."""
        first = await self._client.get(keys.idempotency_key(tenant, idempotency))
        return first.decode() if first else None

    async def add(
        self, tenant: str, pipeline: str, receipt_id: str, parsed: ParsedBody, idempotency: str | None,
        replays: list[str] | None = None,
    ) -> str | None:
        """Buffer the request; returns the first request's receipt id when this one is a retry.
        `replays`: the dlq_ids a DLQ replay re-runs (they leave the DLQ when its batch commits)."""
        first = await self._buffer(
            keys=[
                keys.idempotency_key(tenant, idempotency or "-"),
                keys.receipt_key(tenant, receipt_id),
                keys.input_stream_key(tenant, pipeline),
                keys.backlog_key(tenant),
            ],
            args=[
                receipt_id, parsed.events, pipeline, f"{time.time():.3f}", self._settings.receipt_ttl_s, parsed.ndjson,
                "1" if idempotency else "0", self._settings.idempotency_window_s,
                orjson.dumps(replays).decode() if replays else "",
            ],
        )
        # Outside the script: the registry lives in no tenant's slot, and adding twice is harmless.
        await self._client.sadd(keys.INPUT_STREAMS, keys.member(tenant, pipeline))
        return first.decode() if first else None
