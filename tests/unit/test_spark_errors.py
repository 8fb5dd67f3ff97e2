"""Telling a Spark Connect outage from a batch's own failure.

The exceptions are built here: a stream cancelled while the server stops happens in a window of
milliseconds that no test can aim at (the fault suite's spark_stopped scenario hits it now and
then, which is how the gap was found)."""

from __future__ import annotations

import grpc
from pyspark.errors import AnalysisException
from pyspark.errors.exceptions.connect import SparkConnectGrpcException

from spark_jobs.spark_errors import (
    is_deterministic,
    is_spark_outage,
    is_transport_error,
)


class CancelledRpc(grpc.RpcError):
    def __str__(self) -> str:
        return "<_InactiveRpcError of RPC that terminated with: status = StatusCode.CANCELLED, details = \"Channel closed!\">"


def test_a_broken_exchange_needs_a_probe_and_an_answer_from_spark_does_not() -> None:
    cancelled = CancelledRpc()
    assert not is_spark_outage(cancelled), "not recognisable as an outage by itself"
    assert is_transport_error(cancelled), "so the writer probes the server before blaming the batch"
    assert is_transport_error(SparkConnectGrpcException("Received RST_STREAM"))
    refused = AnalysisException("[UNRESOLVED_COLUMN] x cannot be resolved")
    assert not is_transport_error(refused) and is_deterministic(refused)
    assert is_spark_outage(SparkConnectGrpcException("failed to connect: StatusCode.UNAVAILABLE Connection refused"))
