"""The writer's decisions about failed batches, without I/O: what to try next of a batch whose job
failed, and how much of a round the retries may take."""

from __future__ import annotations

from enum import Enum

from service.writer.batches import Batch
from spark_jobs.spark_errors import is_deterministic

# A request that fails its job this many times alone goes to the DLQ (the second attempt rules out
# a passing fault, such as an executor lost mid-job).
MAX_JOB_ATTEMPTS = 2
# Per round, batches that failed before get at most RETRY_SHARE of the time the round's new
# batches took, within [RETRY_BUDGET_MIN_S, RETRY_BUDGET_MAX_S] (see Writer.write_round).
RETRY_SHARE = 0.5
RETRY_BUDGET_MIN_S = 0.25
RETRY_BUDGET_MAX_S = 2.0


class NextStep(Enum):
    HALVE = "halve"  # several requests: find the ones that fail alone
    RETRY = "retry"  # one request, whose failure may pass
    DEAD_LETTER = "dead_letter"  # one request that failed for itself: to the DLQ (unless Spark stopped under it)


def after_job_failure(batch: Batch, exc: Exception) -> NextStep:
    """What to try next of a batch whose job failed with `exc` (counting the failure of a batch
    of one request)."""
    if len(batch.entries) > 1:
        # Types are inferred per batch, so one request (an array sent as a string, say) can make
        # the whole batch's plan fail. Halving isolates the requests that fail alone.
        return NextStep.HALVE
    batch.failures += 1
    # A plan Spark cannot analyse fails the same way every time: one failure alone settles it.
    # Anything else (a task failure, a lost executor) may pass, so it gets a second try.
    if batch.failures < MAX_JOB_ATTEMPTS and not is_deterministic(exc):
        return NextStep.RETRY
    return NextStep.DEAD_LETTER


def retry_budget_s(new_batches_s: float) -> float:
    """How long this round's retries may take, after its new batches took `new_batches_s`: a
    tenant whose requests fail slows the others by RETRY_SHARE at most; when nothing else is
    waiting, rounds are short and the retries go on at full speed."""
    return min(RETRY_BUDGET_MAX_S, max(RETRY_BUDGET_MIN_S, new_batches_s * RETRY_SHARE))
