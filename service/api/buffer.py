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
from service.tenancy.limits import OverLimits

REGISTER_EVERY_S = 1.0


class RequestBuffer:
    def __init__(self, client: aioredis.Redis, settings: Settings) -> None:
        self._client = client
        self._settings = settings
        self._buffer = client.register_script(scripts.BUFFER)
        self._registered: dict[str, float] = {}  # input streams this api put on the writers' registry, when

    async def add(
        self, tenant: str, pipeline: str, receipt_id: str, parsed: ParsedBody, idempotency: str | None,
        replays: list[str] | None = None, limits: tuple[list[str], list] | None = None,
    ) -> str | None:
        """Buffer the request; returns the first request's receipt id when this one is a retry.
        `replays`: the dlq_ids a DLQ replay re-runs (they leave the DLQ when its batch commits).
        `limits`: the tenant's limits to check and charge first (TenantLimits.checked_in_buffer);
        OverLimits when the request is over them, nothing buffered."""
        limit_keys, limit_args = limits or ([], [])
        first = await self._buffer(
            keys=[
                keys.idempotency_key(tenant, idempotency or "-"),
                keys.receipt_key(tenant, receipt_id),
                keys.input_stream_key(tenant, pipeline),
                keys.backlog_key(tenant),
                *limit_keys,
            ],
            args=[
                receipt_id, parsed.events, pipeline, f"{time.time():.3f}", self._settings.receipt_ttl_s, parsed.ndjson,
                "1" if idempotency else "0", self._settings.idempotency_window_s,
                orjson.dumps(replays).decode() if replays else "", *limit_args,
            ],
        )
        if isinstance(first, list):
            raise OverLimits(*first)
        # Outside the script: the registry lives in no tenant's slot, and adding twice is harmless.
        # Once a second per pipeline is enough (a Redis that lost it lost the stream too).
        member = keys.member(tenant, pipeline)
        now = time.monotonic()
        if now - self._registered.get(member, -REGISTER_EVERY_S) >= REGISTER_EVERY_S:
            await self._client.sadd(keys.INPUT_STREAMS, member)
            self._registered[member] = now
        return first.decode() if first else None
