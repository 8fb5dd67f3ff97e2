"""What log shippers send, with their real client libraries, read back from Iceberg."""

from __future__ import annotations

import orjson
import pytest

from tests.conftest import TEST_TOKEN, Stack, wait_until

pytestmark = pytest.mark.spark

PEOPLE = {
    "name": "people", "source": {"http": {"path": "/people"}},
    "sinks": [{
        "table": "people", "auto_create": True, "operation": "op", "identifier_columns": ["id"],
        "schema": {"columns": [{"name": "id", "type": "long", "required": True}, {"name": "name", "type": "string"}]},
    }],
}


def test_the_elasticsearch_clients_bulk_helper_indexes_and_deletes(stack: Stack) -> None:
    """`helpers.bulk` of the `elasticsearch` client (with an ApiKey): documents indexed into the
    built-in logs pipeline and into a pipeline with identifier columns, then deleted by _id from
    the latter; an update and an unknown index are refused per item, the rest accepted."""
    from elasticsearch import Elasticsearch, helpers

    with stack.client() as http:
        assert http.post("/v1/pipelines", json=PEOPLE).status_code == 201
    client = Elasticsearch(stack.url, api_key=TEST_TOKEN, request_timeout=60)
    assert client.info()["version"]["number"].startswith("8.")
    docs = [{"_index": "logs", "_source": {"id": f"es-{i}", "level": "info"}} for i in range(5)]
    docs += [{"_op_type": "create", "_index": "people", "_id": str(i), "_source": {"name": f"p{i}"}} for i in range(4)]
    assert helpers.bulk(client, docs) == (9, [])
    wait_until(lambda: len(stack.rows("people")) == 4 and len(stack.rows("logs")) == 5, timeout_s=90, what="indexed")
    assert sorted(row["id"] for row in stack.rows("logs")) == [f"es-{i}" for i in range(5)]

    actions = [{"_op_type": "delete", "_index": "people", "_id": "2"}, {"_op_type": "update", "_index": "people", "_id": "1", "doc": {"name": "x"}},
               {"_index": "nope", "_source": {"a": 1}}, {"_op_type": "index", "_index": "people", "_id": "3", "_source": {"name": "three"}}]
    done, errors = helpers.bulk(client, actions, raise_on_error=False)
    assert done == 2 and sorted(next(iter(e)) for e in errors) == ["index", "update"]
    assert sorted(next(iter(e.values()))["status"] for e in errors) == [400, 404]
    wait_until(lambda: sorted(row["id"] for row in stack.rows("people")) == [0, 1, 3], timeout_s=90, what="deleted")
    assert {row["id"]: row["name"] for row in stack.rows("people")} == {0: "p0", 1: "p1", 3: "three"}

    # One document at a time (`POST /{index}/_doc`, `PUT /{index}/_doc/{id}`, `PUT /{index}/_create/{id}`):
    # these were 404 "no pipeline at /logs/_doc".
    answer = client.index(index="logs", document={"id": "es-single", "level": "warn"})
    assert answer["result"] == "created" and answer["_index"] == "logs" and answer["_id"]
    assert client.index(index="people", id="3", document={"name": "three again"})["_id"] == "3"
    assert client.create(index="people", id="7", document={"name": "seven"})["result"] == "created"
    wait_until(lambda: {row["id"]: row["name"] for row in stack.rows("people")} == {0: "p0", 1: "p1", 3: "three again", 7: "seven"},
               timeout_s=90, what="single documents indexed")
    assert "es-single" in {row["id"] for row in stack.rows("logs")}


def test_the_opentelemetry_sdks_otlp_http_exporter_lands_log_records_in_the_otel_logs_table(stack: Stack) -> None:
    """Python's logging through the OpenTelemetry SDK and its OTLP/HTTP exporter (protobuf, gzip):
    every record a row of `otel_logs`, with its attributes, resource, scope and trace context."""
    import logging

    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
    from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
    from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
    from opentelemetry.sdk.resources import Resource

    exporter = OTLPLogExporter(endpoint=f"{stack.url}/otlp/v1/logs", headers={"Authorization": f"Bearer {TEST_TOKEN}"},
                               compression=Compression.Gzip, timeout=30)
    provider = LoggerProvider(resource=Resource.create({"service.name": "checkout"}))
    provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    logger = logging.getLogger("calve.test.otel")
    logger.propagate = False
    logger.addHandler(LoggingHandler(level=logging.INFO, logger_provider=provider))
    for i in range(3):
        logger.warning("payment %d failed", i, extra={"order": i})
    provider.shutdown()
    rows = wait_until(lambda: len(stack.rows("otel_logs")) == 3 and stack.rows("otel_logs"), timeout_s=90, what="the records committed")
    rows.sort(key=lambda row: row["body"])
    assert [row["body"] for row in rows] == [f"payment {i} failed" for i in range(3)]
    first = rows[0]
    assert first["severity_text"] == "WARN" and first["severity_number"] == 13
    assert dict(first["attributes"])["order"] == "0" and dict(first["resource_attributes"])["service.name"] == "checkout"
    assert first["scope_name"] == "calve.test.otel" and first["timestamp"] is not None
    table = stack.catalog().load_table(("demo", "otel_logs"))
    assert [field.transform.__class__.__name__ for field in table.spec().fields] == ["DayTransform"]


def test_an_otlp_export_with_records_bound_for_the_dlq_is_a_partial_success(stack: Stack) -> None:
    """A tenant's own `otel_logs` keeps only traced records (trace_id required): with wait=true the
    answer's partial_success counts the others, which are in the DLQ with the reason."""
    import copy

    from tests.api.test_shippers import OTLP_JSON

    definition = {
        "name": "otel_logs", "source": {"http": {"path": "/otel_logs"}},
        "sinks": [{"table": "traced_logs", "auto_create": True, "schema": {"columns": [
            {"name": "timestamp", "type": "timestamptz", "required": True}, {"name": "body", "type": "string"},
            {"name": "trace_id", "type": "string", "required": True},
        ]}}],
    }
    body = copy.deepcopy(OTLP_JSON)
    with stack.client() as http:
        assert http.put("/v1/pipelines/otel_logs", json=definition).status_code == 200
        answer = http.post("/otlp/v1/logs?wait=true", json=body)
        assert answer.status_code == 200, answer.text
        partial = answer.json()["partialSuccess"]
        assert partial["rejectedLogRecords"] == "1" and "/v1/dlq?pipeline=otel_logs" in partial["errorMessage"]
        dead = http.get("/v1/dlq", params={"pipeline": "otel_logs"}).json()["entries"]
    assert [row["body"] for row in stack.rows("traced_logs")] == ["payment failed"]
    assert len(dead) == 1 and "trace_id" in dead[0]["reason"]


def test_python_logging_loki_pushes_with_basic_auth_into_the_loki_logs_table(stack: Stack) -> None:
    """`python-logging-loki` (JSON, Basic auth with the token as the password, expects 204): each
    line a row with its labels."""
    import logging

    import logging_loki

    handler = logging_loki.LokiHandler(url=f"{stack.url}/loki/api/v1/push", tags={"app": "checkout"},
                                       auth=("any-user", TEST_TOKEN), version="1")
    logger = logging.getLogger("calve.test.loki")
    logger.propagate = False
    logger.addHandler(handler)
    for i in range(3):
        logger.error("line %d", i, extra={"tags": {"attempt": str(i)}})
    handler.close()
    rows = wait_until(lambda: len(stack.rows("loki_logs")) == 3 and stack.rows("loki_logs"), timeout_s=90, what="the lines committed")
    rows.sort(key=lambda row: row["line"])
    assert [row["line"] for row in rows] == [f"line {i}" for i in range(3)]
    labels = dict(rows[1]["labels"])
    assert labels["app"] == "checkout" and labels["attempt"] == "1" and labels["severity"] == "error"


def test_otlp_exports_buffered_as_columns_are_written_by_the_short_way_as_their_lines_by_the_spark_job(stack: Stack) -> None:
    """An export as exporters write it, of COLUMNS_FROM_RECORDS records (fewer are read record by
    record), is buffered as its rows' columns (spark_jobs/otlp_rows.py). The first creates
    `otel_logs` through the Spark job, from the columns' lines; the next ones, in JSON and in
    protobuf, are written by the short way's tasks straight from the columns, which they read from
    Redis. The rows come out the same either way."""
    import base64

    from google.protobuf import json_format
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

    from service.api.routes.otlp import COLUMNS_FROM_RECORDS

    def export(batch: int, trace_id: str = "5B8EFFF798038103D269B633813FC60C") -> dict:
        return {"resourceLogs": [{
            "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "checkout"}}, {"key": "host", "value": {"stringValue": "web-1"}}]},
            "scopeLogs": [{"scope": {"name": "app", "version": "1.0"}, "logRecords": [
                {"timeUnixNano": str(1764000000123456789 + record % 3 * 86_400_000_000_000 + record * 1000), "severityNumber": 9, "severityText": "INFO",
                 "body": {"stringValue": f"record {record} \"quoted\"\nsecond line"}, "traceId": trace_id,
                 "attributes": [{"key": "z", "value": {"intValue": str(record)}}, {"key": "a", "value": {"doubleValue": 0.5}},
                                {"key": "batch", "value": {"intValue": str(batch)}}]}
                for record in range(COLUMNS_FROM_RECORDS)
            ]}],
        }]}

    with stack.client() as http:
        for batch, (content, kind) in enumerate([
            (orjson.dumps(export(0)), "application/json"), (orjson.dumps(export(1)), "application/json"),
            # (protobuf's JSON mapping spells bytes in base64, where OTLP/JSON spells ids in hex)
            (json_format.ParseDict(export(2, base64.b64encode(bytes.fromhex("5B8EFFF798038103D269B633813FC60C")).decode()),
                                   ExportLogsServiceRequest()).SerializeToString(), "application/x-protobuf"),
        ]):
            answer = http.post("/otlp/v1/logs?wait=true&timeout=60", content=content, headers={"Content-Type": kind})
            assert answer.status_code == 200, (batch, answer.text)
    text = stack.metrics()
    assert 'calve_direct_batches_total{outcome="written",pipeline="otel_logs",tenant="demo"} 2.0' in text, "the two after the first: the short way"
    assert 'calve_direct_bodies_total{pipeline="otel_logs",tenant="demo",way="redis"} 2.0' in text
    by_batch: dict[str, list] = {}
    for row in stack.rows("otel_logs"):
        attributes = dict(row.pop("attributes"))
        by_batch.setdefault(attributes.pop("batch"), []).append({**row, "attributes": attributes})
    rows = {batch: sorted(found, key=lambda row: row["body"]) for batch, found in by_batch.items()}
    assert sorted(rows) == ["0", "1", "2"]
    differ = [(batch, name, mine[name], theirs[name]) for batch in ("1", "2") for mine, theirs in zip(rows[batch], rows["0"])
              for name in theirs if mine[name] != theirs[name]]
    assert not differ, differ
    first = rows["0"][0]
    assert first["body"] == 'record 0 "quoted"\nsecond line' and first["trace_id"] == "5b8efff798038103d269b633813fc60c"
    assert first["attributes"] == {"a": "0.5", "z": "0"} and dict(first["resource_attributes"]) == {"host": "web-1", "service.name": "checkout"}
    assert str(first["timestamp"]) == "2025-11-24 16:00:00.123456+00:00" and first["observed_timestamp"] is None
