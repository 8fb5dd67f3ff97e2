"""Calve on the Redis master that Sentinel names (`CALVE_REDIS_URL=redis+sentinel://...`), started
here from Debian's redis-server: a master, its replica and one Sentinel. The roles find the
master through Sentinel, and after a failover (the master killed, the replica promoted) they find
the new one and go on: what was committed before stays committed once, what is sent after
commits."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import orjson
import pytest

from service.core.connections import client_for_url
from tests.conftest import Stack
from tests.harness import RedisSentinelServers, all_committed, assert_exactly_once, post_batches, wait_until
from tests.integration.test_spine import test_every_body_format_is_committed  # noqa: F401 - collected again, through Sentinel

pytestmark = [pytest.mark.spark, pytest.mark.long]  # a deployment beyond the embedded default: make test-long runs it


@pytest.fixture
def sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisSentinelServers]:
    servers = RedisSentinelServers(tmp_path_factory.mktemp("redis-sentinel")).start()
    yield servers
    servers.stop()


@pytest.fixture
def redis_url(sentinel: RedisSentinelServers) -> str:
    return sentinel.url


@pytest.fixture
def redis_client(sentinel: RedisSentinelServers) -> Iterator:
    client = client_for_url(sentinel.url)
    yield client
    client.close()


def test_after_a_failover_every_role_finds_the_promoted_replica(stack: Stack, sentinel: RedisSentinelServers) -> None:
    before = post_batches(stack, 5, 100, "before")
    wait_until(lambda: all_committed(stack, before), 90, what="the first batches committed")
    promoted = sentinel.fail_over()
    assert sentinel.master() == ("127.0.0.1", promoted)

    def send_after() -> str | None:
        # A producer retries what the api could not take while its connections failed over, with
        # an idempotency key: an attempt that was buffered but not answered is not sent twice.
        body = b"\n".join(orjson.dumps({"id": f"after-{i}", "b": 0}) for i in range(100))
        try:
            with stack.client() as http:
                answer = http.post("/logs?wait=true&timeout=30", content=body, headers={"Content-Type": "application/x-ndjson", "Idempotency-Key": "after-failover"})
        except httpx.HTTPError:
            return None
        return answer.json()["status"] if answer.status_code == 200 else None

    assert wait_until(send_after, 90, 1, "a request after the failover committed") == "committed"
    assert_exactly_once(stack, 600)
    assert stack.redis.info("replication")["role"] == "master"
