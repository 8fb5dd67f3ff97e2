"""Per-tenant limits shared by every api replica through Redis.

Rate: two token buckets (events/s and bytes/s) refilled continuously, holding up to `burst_s`
seconds of traffic, checked and charged in one Lua script so concurrent replicas cannot overdraw.
Backlog: a counter of events accepted but not yet committed (raised in the api's script, lowered
when the committer completes a receipt or the writer gives a batch up), compared with the tenant's
cap before accepting. Counting to the commit, not to the write, makes a catalog outage push back
on producers as a Spark outage does.

A tenant refused moments ago (`note_refused`) has its next requests looked at before their bodies
are read (`refused_early`): a tenant over its limits would otherwise have the api parse every body
it refuses, CPU the other tenants share. Meanwhile those of its requests that pass the look go
one at a time, each looking again, to the buffering step's answer (`one_at_a_time`): a look
charges nothing, so when its rate refilled, every request in flight passed the look and had its
body parsed, though only the first fitted.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import redis.asyncio as aioredis

from service.core import keys
from service.protocol import scripts

ALLOWED, WAIT, NEVER = 0, 1, 2  # take_tokens' verdicts (protocol/scripts.py)

# KEYS: events bucket, bytes bucket. ARGV: now_ms, burst_s, then rate and cost for each bucket.
_TAKE = scripts.TAKE_TOKENS + """
local verdict, detail = take_tokens({KEYS[1], KEYS[2]}, tonumber(ARGV[1]), tonumber(ARGV[2]),
  {tonumber(ARGV[3]), tonumber(ARGV[5])}, {tonumber(ARGV[4]), tonumber(ARGV[6])})
return {verdict, detail}
"""


@dataclass(frozen=True)
class RateRefusal:
    """Why a request over its tenant's rate is refused: retry_after_s 0 when it never fits (larger
    than the burst), else when to retry."""

    retry_after_s: int
    message: str


@dataclass(frozen=True)
class Charge:
    """What accepting a request asks of its tenant's limits: room under `backlog_cap` and `events`
    and `size` bytes of its rates."""

    tenant: str
    events: int
    size: int
    backlog_cap: int
    events_per_s: int
    bytes_per_s: int


class OverLimits(Exception):
    """A request the step that buffers it refused for its tenant's limits (api/buffer.py)."""

    def __init__(self, verdict: int, detail: int) -> None:
        super().__init__(verdict, detail)
        self.verdict, self.detail = verdict, detail


_REFUSED_KEPT = 1024  # tenants in the refusal memo before those past their time are let go


class TenantLimits:
    def __init__(self, client: aioredis.Redis, burst_s: float) -> None:
        self._client = client
        self._burst_s = burst_s
        self._take = client.register_script(_TAKE)
        self._look = client.register_script(scripts.LOOK)
        self._refused: dict[str, float] = {}  # tenant -> until when (monotonic) its requests are looked at first
        self._in_turn: dict[str, tuple[asyncio.Lock, list[int]]] = {}  # tenant -> its turn, and how many hold or wait for it

    def note_refused(self, tenant: str, for_s: float) -> None:
        """The tenant was just refused (over its backlog cap or rate): for `for_s` seconds, what it
        sends is looked at before it is read. A tenant refused once that never sends again is let
        go when the memo next grows past _REFUSED_KEPT, with every entry past its time."""
        now = time.monotonic()
        if len(self._refused) >= _REFUSED_KEPT:
            self._refused = {name: until for name, until in self._refused.items() if until > now}
        self._refused[tenant] = now + for_s

    def refused_lately(self, tenant: str) -> bool:
        """Whether the tenant's requests are looked at before they are read (note_refused)."""
        until = self._refused.get(tenant)
        if until is None:
            return False
        if time.monotonic() < until:
            return True
        self._refused.pop(tenant, None)
        return False

    @contextlib.asynccontextmanager
    async def one_at_a_time(self, tenant: str) -> AsyncIterator[None]:
        """The tenant's requests that enter here (those of a tenant refused lately that passed a
        look) run the body one after another, in this process: a look again, then the parse and
        buffering of what passed it, so that the next request's look sees what this one took.
        Kept only while held or waited for."""
        turn = self._in_turn.get(tenant)
        if turn is None:
            turn = self._in_turn[tenant] = (asyncio.Lock(), [0])
        lock, users = turn
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._in_turn[tenant]

    async def refused_early(self, charge: Charge, idempotency: str | None) -> tuple[int, int] | None:
        """For a tenant refused lately, a request's refusal before its body is read, from the
        least it holds (`charge`: its events and bytes at least): the verdict and detail the
        buffering step would give, or None when it may get through (then it is read and checked as
        usual). The answer it would get once read: the backlog cap is checked as buffering checks it,
        and a request whose least is over the rate is over it with all it holds (its Retry-After,
        from the least, may be sooner). A retry of an accepted request (its idempotency key taken)
        is let through to its receipt."""
        buckets = self.bucket_keys(charge.tenant)
        verdict, detail = await self._look(
            keys=[keys.idempotency_key(charge.tenant, idempotency or "-"), keys.backlog_key(charge.tenant), *buckets],
            args=["1" if idempotency else "0", charge.backlog_cap, int(time.time() * 1000), self._burst_s,
                  charge.events_per_s, charge.bytes_per_s, charge.events, charge.size],
        )
        return None if verdict == ALLOWED else (verdict, detail)

    async def take(self, charge: Charge) -> tuple[int, int]:
        """Charge the tenant's rate: take_tokens' verdict and detail (refusal() reads them)."""
        verdict, detail = await self._take(keys=self.bucket_keys(charge.tenant), args=[
            int(time.time() * 1000), self._burst_s, charge.events_per_s, charge.events, charge.bytes_per_s, charge.size,
        ])
        return verdict, detail

    def bucket_keys(self, tenant: str) -> list[str]:
        return [keys.rate_key(tenant, "events"), keys.rate_key(tenant, "bytes")]

    def checked_in_buffer(self, charge: Charge) -> tuple[list[str], list]:
        """The keys and arguments that have BUFFER check and charge `charge` (protocol/scripts.py)."""
        return self.bucket_keys(charge.tenant), [
            charge.backlog_cap, int(time.time() * 1000), self._burst_s, charge.events_per_s, charge.bytes_per_s, charge.size,
        ]

    def refusal(self, charge: Charge, verdict: int, detail: int) -> RateRefusal:
        """take_tokens' verdict other than ALLOWED as an answer."""
        if verdict == NEVER:
            what, rate, cost = ("events", charge.events_per_s, charge.events) if detail == 1 else ("bytes", charge.bytes_per_s, charge.size)
            return RateRefusal(
                retry_after_s=0,
                message=f"one request of {cost} {what} exceeds this tenant's burst of {int(rate * self._burst_s)} {what}; split it",
            )
        retry = max(1, math.ceil(detail / 1000))
        return RateRefusal(
            retry_after_s=retry,
            message=f"tenant {charge.tenant!r} is over its rate limit ({charge.events_per_s} events/s, {charge.bytes_per_s} bytes/s); "
                    f"retry after {retry} s",
        )

    async def backlog(self, tenant: str) -> int:
        return int(await self._client.get(keys.backlog_key(tenant)) or 0)
