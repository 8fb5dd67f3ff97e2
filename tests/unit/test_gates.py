"""The api's caches of the metadata DB ask it once per key when many requests miss at once."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from service.pipelines.store import PipelineCache
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
