"""The writer's decisions about failed batches, without Redis or Spark (service/writer/retries.py)."""

from __future__ import annotations

from pyspark.errors import AnalysisException

from service.protocol.input_entry import InputEntry
from service.writer.batches import Batch
from service.writer.retries import (
    MAX_JOB_ATTEMPTS,
    RETRY_BUDGET_MAX_S,
    RETRY_BUDGET_MIN_S,
    NextStep,
    after_job_failure,
    retry_budget_s,
)


def batch(requests: int) -> Batch:
    made = Batch("demo", "logs")
    for index in range(requests):
        made.add(InputEntry(f"{index + 1}-0", f"r{index}", 1, b'{"id": 1}'))
    return made


def test_a_batch_of_several_requests_is_halved_without_counting_a_failure() -> None:
    failing = batch(5)
    assert after_job_failure(failing, RuntimeError("task failed")) is NextStep.HALVE
    assert failing.failures == 0
    halves = failing.halves()
    assert [len(h.entries) for h in halves] == [2, 3] and sum(h.events for h in halves) == 5
    assert [e.receipt for h in halves for e in h.entries] == [f"r{i}" for i in range(5)], "order kept"


def test_one_request_gets_a_second_try_for_a_failure_that_may_pass() -> None:
    alone = batch(1)
    steps = [after_job_failure(alone, RuntimeError("executor lost")) for _ in range(MAX_JOB_ATTEMPTS)]
    assert steps == [NextStep.RETRY] * (MAX_JOB_ATTEMPTS - 1) + [NextStep.DEAD_LETTER]
    assert alone.failures == MAX_JOB_ATTEMPTS


def test_a_plan_spark_cannot_analyse_goes_to_the_dlq_at_once() -> None:
    alone = batch(1)
    assert after_job_failure(alone, AnalysisException("cannot resolve column")) is NextStep.DEAD_LETTER


def test_retries_take_a_bounded_share_of_the_round() -> None:
    assert retry_budget_s(0.0) == RETRY_BUDGET_MIN_S, "an idle round still gives the retries some time"
    assert RETRY_BUDGET_MIN_S < retry_budget_s(1.0) < 1.0, "a share of what the new batches took"
    assert retry_budget_s(60.0) == RETRY_BUDGET_MAX_S, "never more than the cap, however long the round"
