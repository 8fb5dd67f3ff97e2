"""Processes killed at the exact points that matter: nothing lost, nothing duplicated.

Each test starts a role with one fault point switched on (CALVE_FAULT_POINTS); the process kills
itself with SIGKILL there, and a normal process of the same role has to finish the work.
"""

from __future__ import annotations

import pytest

from service.core import faults, keys
from tests.conftest import all_committed, assert_exactly_once, post_batches, wait_until

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("point", [faults.COMMITTER_BEFORE_CATALOG_COMMIT, faults.COMMITTER_AFTER_CATALOG_COMMIT])
def test_committer_killed_at_the_catalog_commit(stack_factory, point: str) -> None:  # noqa: ANN001
    stack = stack_factory(roles=("api", "writer"), CALVE_LEASE_S="2")
    receipts = post_batches(stack, batches=3, per_batch=10, prefix="c")
    wait_until(lambda: stack.redis.xlen(keys.commit_stream_key("demo", "logs")) >= 1, what="files written")
    doomed = stack.start("committer", name="doomed", env={faults.ENV: point})
    assert doomed.wait(60) == -9, "the fault point killed the committer"
    table = stack.catalog().load_table(("demo", "logs"))
    assert (table.current_snapshot() is not None) == (point == faults.COMMITTER_AFTER_CATALOG_COMMIT)
    stack.start("committer")  # takes the table over once the dead one's lease runs out
    wait_until(lambda: all_committed(stack, receipts), timeout_s=60, what="receipts committed by the successor")
    assert_exactly_once(stack, 30)
    assert len(stack.catalog().load_table(("demo", "logs")).snapshots()) == 1


def test_writer_killed_after_its_spark_job(stack_factory) -> None:  # noqa: ANN001
    stack = stack_factory(roles=("api", "committer"), CALVE_WRITER_CLAIM_IDLE_S="3")
    doomed = stack.start("writer", name="doomed", env={faults.ENV: faults.WRITER_AFTER_SPARK_JOB})
    receipts = post_batches(stack, batches=3, per_batch=10, prefix="w")
    assert doomed.wait(90) == -9, "the fault point killed the writer"
    stack.start("writer")  # reclaims the dead writer's pending entries
    wait_until(lambda: all_committed(stack, receipts), timeout_s=90, what="receipts committed")
    assert_exactly_once(stack, 30)
