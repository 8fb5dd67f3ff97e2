"""The fault suite inside `make test-long` (select with `-m chaos`; `make test` skips it).

Each scenario of tests/chaos/scenarios.py against the session's Redis and Spark Connect, which the Redis
and Spark scenarios kill and start again on the same port. The scenarios with runners of their own
(several tenants, row changes) are in test_chaos_tenants.py: a file runs whole on one pytest
worker, and the two halves take about as long.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.scenarios import SCENARIOS, Scenario, line, run
from tests.harness import RedisServer, SparkServer

pytestmark = [pytest.mark.chaos, pytest.mark.spark]

FAULTS = [scenario for scenario in SCENARIOS if scenario.runner is None]


def passes(scenario: Scenario, tmp_path: Path, redis_server: RedisServer, spark_server: SparkServer | None, spark_remote: str) -> None:
    if scenario.needs_spark_server and spark_server is None:
        pytest.skip("Spark Connect is external (CALVE_TEST_SPARK_REMOTE): this run cannot stop it")
    figures = run(scenario, tmp_path, redis_server, spark_server, spark_remote)
    print(line(scenario.name, figures))
    if not figures.passed:
        print(complaints(tmp_path))
    assert figures.passed, line(scenario.name, figures)
    assert figures.ok_202 + figures.ok_200 > 0, "the load got acknowledgements"


def complaints(base: Path, last: int = 15) -> str:
    """The last warnings and errors of each Calve process's log under `base`: what a failed
    scenario's output needs to be understood where its files are gone (CI)."""
    parts = []
    for log in sorted(base.rglob("*.log")):
        if log.parent.name.startswith(("redis", "spark")):
            continue
        rows = [row[:300] for row in log.read_text(errors="replace").splitlines() if " WARNING " in row or " ERROR " in row]
        if rows:
            parts.append(f"-- {log.relative_to(base)}: last {min(last, len(rows))} of {len(rows)} warnings and errors\n" + "\n".join(rows[-last:]))
    return "\n".join(parts)


@pytest.mark.parametrize("scenario", FAULTS, ids=[s.name for s in FAULTS])
def test_chaos(scenario, tmp_path: Path, redis_server: RedisServer, spark_server: SparkServer | None, spark_remote: str) -> None:  # noqa: ANN001
    passes(scenario, tmp_path, redis_server, spark_server, spark_remote)
