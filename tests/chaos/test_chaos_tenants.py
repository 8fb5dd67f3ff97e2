"""The fault suite's scenarios with runners of their own: a noisy tenant beside two good ones, and
row changes under failover (the others are in test_chaos.py, which says why they are apart)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.scenarios import SCENARIOS
from tests.chaos.test_chaos import passes
from tests.harness import RedisServer, SparkServer

pytestmark = [pytest.mark.chaos, pytest.mark.spark]

OWN_RUNNERS = [scenario for scenario in SCENARIOS if scenario.runner is not None]


@pytest.mark.parametrize("scenario", OWN_RUNNERS, ids=[s.name for s in OWN_RUNNERS])
def test_chaos(scenario, tmp_path: Path, redis_server: RedisServer, spark_server: SparkServer | None, spark_remote: str) -> None:  # noqa: ANN001
    passes(scenario, tmp_path, redis_server, spark_server, spark_remote)
