"""The api's caches of the metadata DB ask it once per key when many requests miss at once, and
look an entry in use up again before it expires."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from service.pipelines.store import MISSING, PipelineCache
from service.tenancy.tenants import Principal, PrincipalCache

CALLERS = 16


def _all_at_once(call) -> list:  # noqa: ANN001
    """`call()` from CALLERS threads released together; their answers."""
    start = threading.Barrier(CALLERS)

    def one(_: int) -> object:
        start.wait()
        return call()

    with ThreadPoolExecutor(CALLERS) as pool:
        return list(pool.map(one, range(CALLERS)))


def _slow_loader(answer: object) -> tuple[list[int], object]:
    calls: list[int] = []

    def load(*_args: object) -> object:
        calls.append(1)
        time.sleep(0.05)  # long enough for every caller to miss before it answers
        return answer

    return calls, load


def test_requests_missing_a_pipeline_at_once_ask_the_database_once() -> None:
    cache = PipelineCache(ttl_s=60)
    calls, load = _slow_loader(None)  # no pipeline there: kept as such too
    assert _all_at_once(lambda: cache.get(("demo", "/logs"), load)) == [None] * CALLERS
    assert len(calls) == 1
    _all_at_once(lambda: cache.get(("demo", "/other"), load))
    assert len(calls) == 2, "another key is loaded on its own"


def test_requests_missing_a_token_at_once_look_it_up_once() -> None:
    cache = PrincipalCache(ttl_s=60)
    principal = Principal(tenant="demo", scopes=frozenset({"ingest"}), token_id=1)
    calls, lookup = _slow_loader(principal)
    assert _all_at_once(lambda: cache.load("secret-token", lookup)) == [principal] * CALLERS
    assert len(calls) == 1


def test_an_entry_past_half_its_time_is_due_once_and_kept_anew_by_its_lookup() -> None:
    """RefreshAhead: due() says yes once for an entry past half its time (the caller then
    refreshes it), no while that lookup runs; refresh() keeps its answer for a whole time again,
    or drops a token whose lookup finds none (revoked unheard)."""
    cache = PrincipalCache(ttl_s=1.0)
    principal = Principal(tenant="demo", scopes=frozenset({"ingest"}), token_id=1)
    cache.load("secret-token", lambda _token: principal)
    assert not cache.due("secret-token") and not cache.due("never-seen")
    time.sleep(0.6)
    assert cache.due("secret-token") and not cache.due("secret-token")  # (one lookup at a time)
    cache.refresh("secret-token", lambda _token: principal)
    time.sleep(0.6)  # past the first load's time: kept by the refresh
    assert cache.get("secret-token") == principal and cache.due("secret-token")
    cache.refresh("secret-token", lambda _token: None)
    assert cache.get("secret-token") is None and not cache.due("secret-token")
    pipelines = PipelineCache(ttl_s=1.0)
    pipelines.get(("demo", "/logs"), lambda: "v1")
    time.sleep(0.6)
    assert pipelines.due(("demo", "/logs"))
    pipelines.refresh(("demo", "/logs"), lambda: "v2")
    time.sleep(0.6)
    assert pipelines.cached(("demo", "/logs")) == "v2"


def test_a_clear_while_an_entry_is_looked_up_again_wins_over_the_lookup() -> None:
    """An announced revocation (or pipeline change) clears the cache: a lookup begun before it
    may have read the DB before the change, so its answer is not kept; a failed lookup leaves the
    entry to expire and lets a later request try again."""
    cache = PrincipalCache(ttl_s=1.0)
    principal = Principal(tenant="demo", scopes=frozenset({"ingest"}), token_id=1)
    cache.load("secret-token", lambda _token: principal)
    time.sleep(0.6)
    assert cache.due("secret-token")

    def read_before_the_revocation(_token: str) -> Principal:
        cache.clear()  # (the announcement arrives while the lookup runs)
        return principal

    cache.refresh("secret-token", read_before_the_revocation)
    assert cache.get("secret-token") is None
    pipelines = PipelineCache(ttl_s=1.0)
    pipelines.get(("demo", "/logs"), lambda: "v1")
    time.sleep(0.6)
    assert pipelines.due(("demo", "/logs"))

    def away() -> str:
        raise ConnectionError("the metadata DB is away")

    with pytest.raises(ConnectionError):
        pipelines.refresh(("demo", "/logs"), away)
    assert pipelines.cached(("demo", "/logs")) == "v1" and pipelines.due(("demo", "/logs"))


def test_a_token_looked_up_while_its_revocation_is_announced_is_answered_but_not_kept() -> None:
    """PrincipalCache.load (the route's way): the request whose lookup raced the announcement
    gets its answer, but the cache keeps nothing the DB may have said before the revocation;
    the next request looks the token up again. The same for a pipeline changed meanwhile."""
    cache = PrincipalCache(ttl_s=60)
    principal = Principal(tenant="demo", scopes=frozenset({"ingest"}), token_id=1)

    def read_before_the_revocation(_token: str) -> Principal:
        cache.clear()  # (the announcement arrives while the lookup runs)
        return principal

    assert cache.load("secret-token", read_before_the_revocation) == principal
    assert cache.get("secret-token") is None
    assert cache.load("secret-token", lambda _token: None) is None
    pipelines = PipelineCache(ttl_s=60)

    def read_before_the_change() -> str:
        pipelines.clear()
        return "v1"

    assert pipelines.get(("demo", "/logs"), read_before_the_change) == "v1"
    assert pipelines.cached(("demo", "/logs")) is MISSING
    assert pipelines.get(("demo", "/logs"), lambda: "v2") == "v2" and pipelines.cached(("demo", "/logs")) == "v2"
