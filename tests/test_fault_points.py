"""Processes killed at the exact points that matter: nothing lost, nothing duplicated.

Each test starts a role with one fault point switched on (CALVE_FAULT_POINTS); the process kills
itself with SIGKILL there, and a normal process of the same role has to finish the work.
"""

from __future__ import annotations

import collections

import orjson
import pytest

from service import faults
from service.core import keys
from tests.conftest import Stack, wait_until

pytestmark = pytest.mark.spark


def post(stack: Stack, prefix: str, requests: int = 3, per_request: int = 10) -> list[str]:
    receipts = []
    with stack.client() as http:
        for r in range(requests):
            body = b"\n".join(orjson.dumps({"id": f"{prefix}-{r}-{i}"}) for i in range(per_request))
            answer = http.post("/logs", content=body, headers={"Content-Type": "application/x-ndjson"})
            assert answer.status_code == 202
            receipts.append(answer.json()["receipt"])
    return receipts


def committed(stack: Stack, receipts: list[str]) -> bool:
    with stack.client() as http:
        return all(http.get(f"/v1/receipts/{r}").json()["status"] == "committed" for r in receipts)


def assert_exactly_once(stack: Stack, expected: int) -> None:
    counts = collections.Counter(row["id"] for row in stack.rows())
    assert [k for k, v in counts.items() if v > 1] == []
    assert len(counts) == expected


@pytest.mark.parametrize("point", [faults.COMMITTER_BEFORE_CATALOG_COMMIT, faults.COMMITTER_AFTER_CATALOG_COMMIT])
def test_committer_killed_at_the_catalog_commit(stack_factory, point: str) -> None:  # noqa: ANN001
    stack = stack_factory(roles=("api", "writer"), CALVE_LEASE_S="2")
    receipts = post(stack, "c")
    wait_until(lambda: stack.redis.xlen(keys.commit_stream_key("demo", "logs")) >= 1, what="files written")
    doomed = stack.start("committer", name="doomed", env={faults.ENV: point})
    assert doomed.wait(60) == -9, "the fault point killed the committer"
    table = stack.catalog().load_table(("demo", "logs"))
    assert (table.current_snapshot() is not None) == (point == faults.COMMITTER_AFTER_CATALOG_COMMIT)
    stack.start("committer")  # takes the table over once the dead one's lease runs out
    wait_until(lambda: committed(stack, receipts), timeout_s=60, what="receipts committed by the successor")
    assert_exactly_once(stack, 30)
    assert len(stack.catalog().load_table(("demo", "logs")).snapshots()) == 1


def test_writer_killed_after_its_spark_job(stack_factory) -> None:  # noqa: ANN001
    stack = stack_factory(roles=("api", "committer"), CALVE_WRITER_CLAIM_IDLE_S="3")
    doomed = stack.start("writer", name="doomed", env={faults.ENV: faults.WRITER_AFTER_SPARK_JOB})
    receipts = post(stack, "w")
    assert doomed.wait(90) == -9, "the fault point killed the writer"
    stack.start("writer")  # reclaims the dead writer's pending entries
    wait_until(lambda: committed(stack, receipts), timeout_s=90, what="receipts committed")
    assert_exactly_once(stack, 30)
