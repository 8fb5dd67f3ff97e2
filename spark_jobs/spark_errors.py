"""Telling a Spark Connect outage (wait it out, keep the batch) from a failure of the batch's own
job (count it against the batch)."""

from __future__ import annotations

import grpc
from pyspark.errors import AnalysisException, PySparkException
from pyspark.errors.exceptions.connect import SparkConnectGrpcException

# Errors that say the Spark Connect server (or this client's session on it) is gone, not that the
# batch is at fault: seen while the server stops, restarts, or after the client reconnected.
OUTAGE_ERROR_CLASSES = ("INVALID_HANDLE", "NO_ACTIVE_SESSION", "RETRIES_EXCEEDED")
OUTAGE_MESSAGES = ("StatusCode.UNAVAILABLE", "stopped SparkContext", "Connection refused", "Socket closed")


def is_spark_outage(exc: BaseException) -> bool:
    """Spark Connect cannot be reached, or restarted and lost this client's session: the batch is
    not at fault, so it is kept and retried without limit. Every other error (an analysis error, a
    failed task, a message too deep to decode, a deadline) is the batch's own and is counted."""
    if isinstance(exc, SparkConnectGrpcException) and exc.getGrpcStatusCode() == grpc.StatusCode.UNAVAILABLE:
        return True
    if isinstance(exc, PySparkException) and (exc.getErrorClass() or "").startswith(OUTAGE_ERROR_CLASSES):
        return True
    return isinstance(exc, (PySparkException, grpc.RpcError)) and any(text in str(exc) for text in OUTAGE_MESSAGES)


def is_transport_error(exc: BaseException) -> bool:
    """A broken gRPC exchange rather than an error Spark answered (which names an error class):
    an outage or the batch's own (a message too deep to decode), which only a probe of the server
    tells apart."""
    if isinstance(exc, grpc.RpcError):
        return True
    return isinstance(exc, SparkConnectGrpcException) and not exc.getErrorClass()


def is_deterministic(exc: BaseException) -> bool:
    """Spark refused the job's plan (an analysis error: a type mismatch, an unresolved field): the
    same request fails the same way on every attempt."""
    return isinstance(exc, AnalysisException)
