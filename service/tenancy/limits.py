"""Per-tenant limits shared by every api replica through Redis.

Rate: two token buckets (events/s and bytes/s) refilled continuously, holding up to `burst_s`
seconds of traffic, checked and charged in one Lua script so concurrent replicas cannot overdraw.
Backlog: a counter of events accepted but not yet committed (raised in the api's script, lowered
when the committer completes a receipt or the writer gives a batch up), compared with the tenant's
cap before accepting. Counting to the commit, not to the write, makes a catalog outage push back
on producers as a Spark outage does.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import redis.asyncio as aioredis

from service.core import keys

ALLOWED, WAIT, NEVER = 0, 1, 2

# KEYS: events bucket, bytes bucket. ARGV: now_ms, burst_s, then rate and cost for each bucket.
# Returns {ALLOWED} | {WAIT, ms until enough has refilled} | {NEVER, index of the bucket too small}.
_TAKE = """
local now = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local level = {}
for i = 1, 2 do
  local rate = tonumber(ARGV[1 + 2 * i])
  local cost = tonumber(ARGV[2 + 2 * i])
  local capacity = rate * burst
  if cost > capacity then return {2, i} end
  local state = redis.call('HMGET', KEYS[i], 'tokens', 'ts')
  local tokens = tonumber(state[1]) or capacity
  local ts = tonumber(state[2]) or now
  tokens = math.min(capacity, tokens + math.max(0, now - ts) / 1000 * rate)
  level[i] = tokens
end
local wait = 0
for i = 1, 2 do
  local rate = tonumber(ARGV[1 + 2 * i])
  local cost = tonumber(ARGV[2 + 2 * i])
  if cost > level[i] then wait = math.max(wait, (cost - level[i]) / rate * 1000) end
end
if wait > 0 then return {1, math.ceil(wait)} end
for i = 1, 2 do
  local cost = tonumber(ARGV[2 + 2 * i])
  redis.call('HSET', KEYS[i], 'tokens', tostring(level[i] - cost), 'ts', tostring(now))
  redis.call('PEXPIRE', KEYS[i], math.ceil(burst * 1000) + 60000)
end
return {0, 0}
"""


@dataclass(frozen=True)
class RateDecision:
    allowed: bool
    retry_after_s: int = 0
    message: str = ""


class TenantLimits:
    def __init__(self, client: aioredis.Redis, burst_s: float) -> None:
        self._client = client
        self._burst_s = burst_s
        self._take = client.register_script(_TAKE)

    async def take(self, tenant: str, events: int, size: int, events_per_s: int, bytes_per_s: int) -> RateDecision:
        verdict, detail = await self._take(
            keys=[keys.rate_key(tenant, "events"), keys.rate_key(tenant, "bytes")],
            args=[int(time.time() * 1000), self._burst_s, events_per_s, events, bytes_per_s, size],
        )
        if verdict == ALLOWED:
            return RateDecision(True)
        if verdict == NEVER:
            what, rate, cost = ("events", events_per_s, events) if detail == 1 else ("bytes", bytes_per_s, size)
            return RateDecision(
                False, retry_after_s=0,
                message=f"one request of {cost} {what} exceeds this tenant's burst of {int(rate * self._burst_s)} {what}; split it",
            )
        retry = max(1, math.ceil(detail / 1000))
        return RateDecision(
            False, retry_after_s=retry,
            message=f"tenant {tenant!r} is over its rate limit ({events_per_s} events/s, {bytes_per_s} bytes/s); retry after {retry} s",
        )

    async def backlog(self, tenant: str) -> int:
        return int(await self._client.get(keys.backlog_key(tenant)) or 0)
