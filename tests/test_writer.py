"""Writer failover: entries a crashed writer read but never acknowledged are written by another."""

from __future__ import annotations

import pytest

from service.core import keys
from tests.conftest import wait_until

pytestmark = pytest.mark.spark


def test_entries_of_a_dead_writer_are_reclaimed_and_written_once(stack_factory) -> None:  # noqa: ANN001
    stack = stack_factory(roles=("api",), CALVE_WRITER_CLAIM_IDLE_S="2")
    stream = keys.input_stream_key("demo", "logs")
    with stack.client() as http:
        receipts = [http.post("/logs", json={"id": f"orphan-{i}"}).json()["receipt"] for i in range(5)]
    # A writer that read the entries and died before its hand-off: they sit in its pending list.
    stack.redis.xgroup_create(stream, keys.WRITER_GROUP, id="0", mkstream=True)
    delivered = stack.redis.xreadgroup(keys.WRITER_GROUP, "dead-writer", {stream: ">"}, count=100)
    assert len(delivered[0][1]) == 5
    assert stack.redis.xpending(stream, keys.WRITER_GROUP)["pending"] == 5

    stack.start("writer")
    stack.start("committer")
    with stack.client() as http:
        wait_until(
            lambda: all(http.get(f"/v1/receipts/{r}").json()["status"] == "committed" for r in receipts),
            timeout_s=90, what="reclaimed entries committed",
        )
    assert sorted(row["id"] for row in stack.rows()) == [f"orphan-{i}" for i in range(5)]
    assert stack.redis.xpending(stream, keys.WRITER_GROUP)["pending"] == 0
    assert stack.redis.xlen(stream) == 0, "written entries are deleted from the input stream"
