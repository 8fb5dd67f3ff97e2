"""Calve on a 3-master Redis Cluster (`CALVE_REDIS_CLUSTER=1`), started here from Debian's
redis-server: the spine's tests again (ingest, exactly-once under a committer kill and a dead
writer, leases, backlog), row changes and upkeep by hand, each of which crosses from a tenant's
keys to the registries and queues every tenant shares; two tenants whose keys live on
different nodes; and a settled receipt's announcement, published by a script on its tenant's
node, reaching the api's subscription. A command whose keys span slots fails on a cluster (CROSSSLOT): these tests
fail wherever a script or transaction mixes them."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from sqlmodel import Session

from service.api.waiter import ReceiptWaiter
from service.committer.receipts import ReceiptPublisher
from service.core import keys
from service.core.db import get_engine
from service.tenancy.tenants import create_tenant, issue_token
from tests.conftest import Stack
from tests.harness import RedisClusterServers
from tests.integration.test_committer import (  # noqa: F401 - collected again, on the cluster
    test_committer_killed_and_restarted_loses_and_duplicates_nothing,
    test_two_committers_never_commit_the_same_files,
)
from tests.integration.test_compaction import test_upkeep_by_hand_answers_what_each_task_did  # noqa: F401
from tests.integration.test_row_changes import test_inserts_updates_and_deletes_apply_in_order_and_are_counted  # noqa: F401
from tests.integration.test_spine import (  # noqa: F401
    test_every_body_format_is_committed,
    test_retried_request_with_idempotency_key_is_committed_once,
    test_sigterm_drains_the_api_and_the_committer_commits_what_it_has,
    test_wait_true_answers_only_once_rows_are_readable,
)
from tests.integration.test_writer import (  # noqa: F401
    test_backlog_counts_events_until_they_are_committed,
    test_entries_of_a_dead_writer_are_reclaimed_and_written_once,
)

pytestmark = [pytest.mark.spark, pytest.mark.long]  # a deployment beyond the embedded default: make test-long runs it


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    servers = RedisClusterServers(tmp_path_factory.mktemp("redis-cluster")).start()
    yield servers
    servers.stop()


@pytest.fixture
def redis_url(redis_cluster: RedisClusterServers) -> str:
    return redis_cluster.url


@pytest.fixture
def redis_client(redis_cluster: RedisClusterServers) -> Iterator[RedisCluster]:
    client = RedisCluster.from_url(redis_cluster.url)
    client.flushall(target_nodes=RedisCluster.PRIMARIES)
    yield client
    client.flushall(target_nodes=RedisCluster.PRIMARIES)
    client.close()


@pytest.fixture
def stack_overrides() -> dict[str, str]:
    return {"CALVE_REDIS_CLUSTER": "1"}


def test_two_tenants_on_different_nodes_are_both_committed(stack: Stack, redis_client: RedisCluster) -> None:
    """Tenant demo and a tenant whose keys hash to another node send at once; the writer reads
    both tenants' streams (one command each) and every request of both is committed."""
    home = redis_client.get_node_from_key(keys.input_stream_key("demo", "logs"))
    other = next(
        name for name in (f"t{n}" for n in range(100))
        if redis_client.get_node_from_key(keys.input_stream_key(name, "logs")) != home
    )
    with Session(get_engine(stack.settings.resolved_database_url())) as session:
        _row, token = issue_token(session, create_tenant(session, other))
    with stack.client() as demo, stack.client(token) as them:
        first = [demo.post("/logs", json=[{"who": "demo", "n": n}]).json()["receipt"] for n in range(5)]
        first += [them.post("/logs", json=[{"who": other, "n": n}]).json()["receipt"] for n in range(5)]
        assert demo.post("/logs?wait=true&timeout=60", json={"who": "demo", "n": 5}).json()["status"] == "committed"
        assert them.post("/logs?wait=true&timeout=60", json={"who": other, "n": 5}).json()["status"] == "committed"
    assert sorted(row["n"] for row in stack.rows()) == list(range(6))
    assert sorted(row["n"] for row in stack.rows(tenant=other)) == list(range(6))
    assert redis_client.get(keys.backlog_key("demo")) in (None, b"0") and redis_client.get(keys.backlog_key(other)) in (None, b"0")


def test_a_settled_receipt_is_announced_with_its_fields_to_an_api_on_any_node(redis_cluster: RedisClusterServers, redis_client: RedisCluster) -> None:
    """The committer's script PUBLISHes on the node of the tenant's slot; a cluster delivers it to
    the api's subscription wherever that is, and the waiting requests answer from the fields it
    carries. (The waiter's reads of receipts are counted, not replaced: the poll every 2 s would
    also answer, so the count says which did.)"""
    tenants = ["demo", "other", "third"]
    assert len({redis_client.get_node_from_key(keys.receipt_key(tenant, "r")).name for tenant in tenants}) > 1, "tenants on more than one node"
    for tenant in tenants:
        redis_client.hset(keys.receipt_key(tenant, f"r-{tenant}"), mapping={"status": "written", "tables": "1", "events": "3", "created_at": "1.5"})

    async def wait_and_commit() -> tuple[list, int]:
        client = AsyncRedisCluster.from_url(redis_cluster.url)
        waiter = ReceiptWaiter(client)
        reads = []
        hgetall = client.hgetall

        async def counted(*args):  # noqa: ANN002, ANN202
            reads.append(args)
            return await hgetall(*args)

        client.hgetall = counted
        await waiter.start()
        try:
            await asyncio.sleep(1.0)  # subscribed
            waits = [asyncio.create_task(waiter.wait(tenant, f"r-{tenant}", 20, fresh=True)) for tenant in tenants]
            await asyncio.sleep(0.1)
            for tenant in tenants:
                await asyncio.to_thread(ReceiptPublisher(redis_client).mark_committed, tenant, "logs", 7, {f"r-{tenant}": 3})
            return await asyncio.wait_for(asyncio.gather(*waits), timeout=10), len(reads)
        finally:
            await waiter.stop()
            await client.aclose()

    answers, reads = asyncio.run(wait_and_commit())
    assert [(answer.status, answer.tables) for answer in answers] == [("committed", {"logs": {"rows": 3, "snapshot_id": 7}})] * 3
    assert reads == 0, "answered by reading the receipts, not from the announcement"
