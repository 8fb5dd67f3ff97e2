"""A tenant refused moments ago has its requests looked at before they are read, one at a time
(api/routes/ingest.py `looked_at`, tenancy/limits.py), on a real Redis."""

from __future__ import annotations

import asyncio
from pathlib import Path

import redis
import redis.asyncio as aioredis
from fastapi import HTTPException

from service.api.routes.ingest import charge_of, looked_at
from service.core.config import Settings
from service.tenancy.limits import _REFUSED_KEPT, ALLOWED, TenantLimits
from service.tenancy.tenants import Principal


def principal(tenant: str) -> Principal:
    return Principal(tenant, frozenset({"ingest"}), 1, max_events_per_s=10, max_bytes_per_s=10**9, max_backlog_events=10**6)


def test_after_a_refill_a_refused_tenants_next_request_looks_only_once_the_one_that_passed_was_charged(
        redis_client: redis.Redis, redis_url: str, tmp_path: Path) -> None:
    """A look charges nothing: had every request in flight looked at once when the rate refilled
    for one, each would have passed, been parsed, and all but the first been refused once parsed.
    Here the second waits for the first to be charged, then is refused unread; a tenant not refused
    lately does not wait; nothing is kept once no request holds or waits for the turn."""
    settings = Settings(data_dir=tmp_path, redis_url=redis_url)
    gate, other = principal("gate"), principal("other")  # a burst of 20 events each (10 a second, 2 s)

    async def main() -> tuple[list[str], BaseException | None]:
        client = aioredis.Redis.from_url(redis_url)
        limits = TenantLimits(client, burst_s=2.0)
        limits.note_refused("gate", 5)
        seen: list[str] = []

        async def second() -> None:
            async with looked_at(limits, gate, settings, None, 19, 100):
                seen.append("second read")

        async def unrefused() -> None:
            async with looked_at(limits, other, settings, None, 19, 100):
                seen.append("other tenant read")

        async with looked_at(limits, gate, settings, None, 19, 100):
            seen.append("first read")
            waiting = asyncio.gather(second(), return_exceptions=True)
            await unrefused()
            await asyncio.sleep(0.2)  # the first's parse: the second looks meanwhile, or waits
            verdict, _detail = await limits.take(charge_of(gate, settings, 19, 100))
            assert verdict == ALLOWED
            seen.append("first charged")
        (outcome,) = await waiting
        assert not limits._in_turn, "a turn no request holds or waits for is dropped"
        await client.aclose()
        return seen, outcome

    seen, outcome = asyncio.run(main())
    assert seen == ["first read", "other tenant read", "first charged"], seen
    assert isinstance(outcome, HTTPException) and outcome.status_code == 429, outcome
    assert int(outcome.headers["Retry-After"]) >= 1


def test_a_tenant_not_refused_lately_is_not_looked_at(redis_client: redis.Redis, redis_url: str, tmp_path: Path) -> None:
    """Before any refusal, a request goes straight on to be read, whatever it holds, and takes no turn."""
    settings = Settings(data_dir=tmp_path, redis_url=redis_url)

    async def main() -> bool:
        client = aioredis.Redis.from_url(redis_url)
        limits = TenantLimits(client, burst_s=2.0)
        await limits.take(charge_of(principal("fresh"), settings, 20, 100))  # its burst spent: a look would refuse
        async with looked_at(limits, principal("fresh"), settings, None, 19, 100):
            took_turn = bool(limits._in_turn)
        await client.aclose()
        return took_turn

    assert asyncio.run(main()) is False


def test_the_refusal_memo_lets_go_of_tenants_past_their_time_once_it_grows(redis_url: str) -> None:
    """Many tenants refused once that never send again do not pile up in an api's memory: once the
    memo holds _REFUSED_KEPT tenants, those past their time are let go; those still within it stay."""
    limits = TenantLimits(aioredis.Redis.from_url(redis_url), burst_s=2.0)
    limits.note_refused("recent", 60)
    for number in range(_REFUSED_KEPT - 1):
        limits.note_refused(f"gone-{number}", 0)  # past its time at once
    assert len(limits._refused) == _REFUSED_KEPT
    limits.note_refused("next", 60)
    assert set(limits._refused) == {"recent", "next"}
    assert limits.refused_lately("recent") and limits.refused_lately("next") and not limits.refused_lately("gone-0")
