"""What shippers' protocols answer, in-process on the real Redis (the clients themselves, with rows
read back from Iceberg, are in tests/integration/test_shippers.py)."""

from __future__ import annotations

import orjson
import redis

from service.core import keys
from service.protocol.input_entry import InputEntry
from spark_jobs.otlp_rows import as_lines


def bulk_body(*lines: dict | str) -> bytes:
    return b"".join((line.encode() if isinstance(line, str) else orjson.dumps(line)) + b"\n" for line in lines)


def post_bulk(app_client, body: bytes, path: str = "/_bulk"):  # noqa: ANN001, ANN201
    return app_client.post(path, content=body, headers={"Content-Type": "application/vnd.elasticsearch+x-ndjson; compatible-with=8"})


def test_bulk_refuses_items_one_by_one_and_buffers_the_rest_as_one_request(app_client, redis_url: str) -> None:  # noqa: ANN001
    client = redis.Redis.from_url(redis_url)
    stream = keys.input_stream_key("demo", "logs")
    before = client.xlen(stream)
    answer = post_bulk(app_client, bulk_body(
        {"index": {"_index": "logs"}}, {"msg": "one"},
        {"create": {"_id": "x"}}, {"msg": "two"},              # the path's index
        {"index": {"_index": "nope"}}, {"msg": "lost"},         # no such pipeline
        {"delete": {"_index": "logs", "_id": "1"}},             # logs changes no rows by key
        {"update": {"_index": "logs", "_id": "1"}}, {"doc": {"msg": "x"}},
        {"index": {}}, "[1, 2]",                                # not an object
    ), path="/logs/_bulk")
    assert answer.status_code == 200 and answer.headers["x-elastic-product"] == "Elasticsearch"
    items = answer.json()["items"]
    assert answer.json()["errors"] is True
    assert [(next(iter(i)), next(iter(i.values()))["status"]) for i in items] == [
        ("index", 201), ("create", 201), ("index", 404), ("delete", 400), ("update", 400), ("index", 400),
    ]
    assert items[1]["create"]["_id"] == "x"
    assert "does not change rows by key" in items[3]["delete"]["error"]["reason"]
    assert client.xlen(stream) == before + 1, "the accepted items are one request on the pipeline's input"
    (entry,) = client.xrevrange(stream, count=1)
    assert InputEntry.from_fields(*entry).events == 2


def test_a_malformed_bulk_body_is_refused_whole(app_client, redis_url: str) -> None:  # noqa: ANN001
    client = redis.Redis.from_url(redis_url)
    stream = keys.input_stream_key("demo", "logs")
    before = client.xlen(stream)
    for body, says in (
        (bulk_body({"index": {"_index": "logs"}}, {"a": 1}, "{not json"), "line 3 is not JSON"),
        (bulk_body({"index": {"_index": "logs"}}, {"a": 1}, {"index": {}}), "has no document line"),
        (bulk_body({"upsert": {}}, {"a": 1}), "an action is one of"),
        (b"\n\n", "empty"),
    ):
        answer = post_bulk(app_client, body)
        assert answer.status_code == 400 and says in answer.json()["detail"], answer.text
    assert client.xlen(stream) == before, "nothing of a refused body is buffered"


def test_shippers_probes_of_an_elasticsearch_endpoint_are_answered(app_client) -> None:  # noqa: ANN001
    info = app_client.get("/", headers={"Accept": "application/vnd.elasticsearch+json; compatible-with=8"})
    assert info.status_code == 200 and info.json()["version"]["number"].startswith("8.")
    head = app_client.head("/")
    assert head.status_code == 200 and head.headers["x-elastic-product"] == "Elasticsearch"
    page = app_client.get("/", headers={"Accept": "text/html"})
    assert "Calve console" in page.text


OTLP_JSON = {  # as the OpenTelemetry Collector's otlphttp exporter sends it (encoding: json)
    "resourceLogs": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "checkout"}}]},
        "scopeLogs": [{
            "scope": {"name": "app.logger", "version": "1.2"},
            "logRecords": [
                {"timeUnixNano": "1764000000123456789", "observedTimeUnixNano": 1764000000200000000, "severityNumber": 17,
                 "severityText": "ERROR", "body": {"stringValue": "payment failed"},
                 "attributes": [{"key": "order", "value": {"intValue": "42"}},
                                {"key": "tags", "value": {"arrayValue": {"values": [{"stringValue": "a"}, {"boolValue": True}]}}}],
                 "traceId": "5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b174", "flags": 1,
                 "someFieldFromTheFuture": {"x": 1}},
                {"observedTimeUnixNano": "1764000001000000000", "body": {"kvlistValue": {"values": [{"key": "k", "value": {"doubleValue": 1.5}}]}}},
            ],
        }],
    }],
}


def last_events(client: redis.Redis, pipeline: str) -> list[dict]:
    (entry,) = client.xrevrange(keys.input_stream_key("demo", pipeline), count=1)
    return [orjson.loads(line) for line in as_lines(InputEntry.from_fields(*entry).body).splitlines()]  # OTLP: its columns' lines


def test_otlp_json_and_protobuf_log_records_become_events_of_the_otel_logs_pipeline(app_client, redis_url: str) -> None:  # noqa: ANN001
    from google.protobuf import json_format
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest, ExportLogsServiceResponse

    client = redis.Redis.from_url(redis_url)
    answer = app_client.post("/otlp/v1/logs", content=orjson.dumps(OTLP_JSON), headers={"Content-Type": "application/json"})
    assert answer.status_code == 200 and answer.headers["content-type"] == "application/json" and answer.json() == {}, answer.text
    first, second = last_events(client, "otel_logs")
    assert first == {
        "timestamp": "2025-11-24T16:00:00.123456Z", "observed_timestamp": "2025-11-24T16:00:00.200000Z",
        "severity_number": 17, "severity_text": "ERROR", "body": "payment failed",
        "attributes": {"order": "42", "tags": '["a",true]'}, "resource_attributes": {"service.name": "checkout"},
        "scope_name": "app.logger", "scope_version": "1.2",
        "trace_id": "5b8efff798038103d269b633813fc60c", "span_id": "eee19b7ec3c1b174", "flags": 1,
    }
    assert second["timestamp"] == "2025-11-24T16:00:01.000000Z", "no time: the observed time"
    assert second["body"] == '{"k":1.5}'

    # The same records in protobuf (as the SDK's exporter sends them), gzipped: the same events.
    import gzip

    request = ExportLogsServiceRequest()
    json_format.ParseDict(orjson.loads(orjson.dumps(OTLP_JSON).replace(b"5b8efff798038103d269b633813fc60c", b"W47/95gDgQPSabYzgT/GDA==")
                                       .replace(b"eee19b7ec3c1b174", b"7uGbfsPBsXQ=")), request, ignore_unknown_fields=True)
    answer = app_client.post("/otlp/v1/logs", content=gzip.compress(request.SerializeToString()),
                             headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"})
    assert answer.status_code == 200 and answer.headers["content-type"] == "application/x-protobuf"
    assert not ExportLogsServiceResponse.FromString(answer.content).HasField("partial_success")
    assert last_events(client, "otel_logs") == [first, second]


def test_an_otlp_body_that_is_not_an_any_value_is_kept_as_sent_never_as_the_text_null(app_client, redis_url: str) -> None:  # noqa: ANN001
    """Hand-written senders put the value itself in "body"; an empty AnyValue is no body at all."""
    client = redis.Redis.from_url(redis_url)
    bodies = ["hello bare string", 42, True, 1.5, ["a", 1], {"message": "x"}, {}, {"stringValue": "as OTLP says"}]
    records = [{"timeUnixNano": "1764000000123456789", "body": body} for body in bodies]
    document = {"resourceLogs": [{"scopeLogs": [{"logRecords": records}]}]}
    answer = app_client.post("/otlp/v1/logs", content=orjson.dumps(document), headers={"Content-Type": "application/json"})
    assert answer.status_code == 200 and answer.json() == {}, answer.text
    kept = [event.get("body") for event in last_events(client, "otel_logs")]
    assert kept == ["hello bare string", "42", "true", "1.5", '["a",1]', '{"message":"x"}', None, "as OTLP says"]


def test_otlp_bodies_that_are_not_log_exports_are_400_and_nothing_is_buffered(app_client, redis_url: str) -> None:  # noqa: ANN001
    client = redis.Redis.from_url(redis_url)
    before = client.xlen(keys.input_stream_key("demo", "otel_logs"))
    for body, kind, says in (
        (b"\xff\x00garbage", "application/x-protobuf", "not an OTLP ExportLogsServiceRequest in protobuf"),
        (b"{nope", "application/json", "not JSON"),
        (orjson.dumps({"resourceLogs": [{"scopeLogs": [{"logRecords": [{"traceId": "zz"}]}]}]}), "application/json", "is not hex"),
        (orjson.dumps({"resourceLogs": [{"scopeLogs": [{"logRecords": [{"timeUnixNano": "99999999999999999999999"}]}]}]}), "application/json",
         "no log record of the export could be read: log record 0: Failed to parse timeUnixNano"),
        (b"{}", "text/plain", "unsupported Content-Type"),
    ):
        answer = app_client.post("/otlp/v1/logs", content=body, headers={"Content-Type": kind})
        assert answer.status_code == 400 and says in answer.json()["detail"], answer.text
    assert app_client.post("/otlp/v1/logs", content=b"{}", headers={"Content-Type": "application/json"}).status_code == 200
    assert client.xlen(keys.input_stream_key("demo", "otel_logs")) == before


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes | int) -> bytes:
    """One protobuf field, written by hand from the wire format, so the test checks Calve's
    declaration of Loki's messages against the field numbers Loki's push.proto gives."""
    if isinstance(payload, int):
        return _varint(number << 3) + _varint(payload)
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def loki_protobuf(labels: str, entries: list[tuple[int, str, dict[str, str]]]) -> bytes:
    stream = _field(1, labels.encode())
    for nanos, line, metadata in entries:
        timestamp = _field(1, nanos // 1_000_000_000) + _field(2, nanos % 1_000_000_000)
        entry = _field(1, timestamp) + _field(2, line.encode())
        entry += b"".join(_field(3, _field(1, k.encode()) + _field(2, v.encode())) for k, v in metadata.items())
        stream += _field(2, entry)
    return _field(1, stream)


def test_loki_pushes_in_json_and_snappy_protobuf_become_events_of_the_loki_logs_pipeline(app_client, redis_url: str) -> None:  # noqa: ANN001
    import gzip

    import cramjam

    client = redis.Redis.from_url(redis_url)
    push = {"streams": [{"stream": {"job": "api", "level": "error"},
                         "values": [["1764000000123456789", "first line"], ["1764000001000000000", "second", {"trace_id": "abc"}]]}]}
    answer = app_client.post("/loki/api/v1/push", content=gzip.compress(orjson.dumps(push)),
                             headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert answer.status_code == 204, answer.text
    expected = [
        {"timestamp": "2025-11-24T16:00:00.123456Z", "line": "first line", "labels": {"job": "api", "level": "error"}},
        {"timestamp": "2025-11-24T16:00:01.000000Z", "line": "second", "labels": {"job": "api", "level": "error"},
         "structured_metadata": {"trace_id": "abc"}},
    ]
    assert last_events(client, "loki_logs") == expected

    body = loki_protobuf('{job="api", level="error"}', [(1764000000123456789, "first line", {}), (1764000001000000000, "second", {"trace_id": "abc"})])
    answer = app_client.post("/loki/api/v1/push", content=bytes(cramjam.snappy.compress_raw(body)), headers={"Content-Type": "application/x-protobuf"})
    assert answer.status_code == 204, answer.text
    assert last_events(client, "loki_logs") == expected

    quoted = loki_protobuf(r'{msg="say \"hi\"", path="a\\b"}', [(1764000000000000000, "x", {})])
    assert app_client.post("/loki/api/v1/push", content=bytes(cramjam.snappy.compress_raw(quoted)),
                           headers={"Content-Type": "application/x-protobuf"}).status_code == 204
    assert last_events(client, "loki_logs")[0]["labels"] == {"msg": 'say "hi"', "path": "a\\b"}


def test_loki_bodies_that_are_not_pushes_are_400_and_nothing_is_buffered(app_client, redis_url: str) -> None:  # noqa: ANN001
    import cramjam

    client = redis.Redis.from_url(redis_url)
    before = client.xlen(keys.input_stream_key("demo", "loki_logs"))
    for body, kind, says in (
        (loki_protobuf('{job="api"}', [(1, "x", {})]), "application/x-protobuf", "snappy"),
        (bytes(cramjam.snappy.compress_raw(b"\xff\xff\xff")), "application/x-protobuf", "not a Loki PushRequest"),
        (bytes(cramjam.snappy.compress_raw(loki_protobuf("job=api", [(1, "x", {})]))), "application/x-protobuf", "stream labels"),
        (orjson.dumps({"streams": [{"stream": {"a": "b"}, "values": [["soon", "x"]]}]}), "application/json", "nanoseconds"),
        (orjson.dumps({"streams": [{"stream": {"a": "b"}, "values": [["1", "x"]]}, {"values": []}]}), "application/json", "streams[1]"),
        (orjson.dumps({"nope": []}), "application/json", "a push request is"),
        (b"x", "text/plain", "unsupported Content-Type"),
    ):
        answer = app_client.post("/loki/api/v1/push", content=body, headers={"Content-Type": kind})
        assert answer.status_code == 400 and says in answer.json()["detail"], answer.text
    assert client.xlen(keys.input_stream_key("demo", "loki_logs")) == before, "nothing of a refused push is buffered"


def test_a_snappy_push_that_would_decompress_past_the_limit_is_413_before_it_is_decompressed(app_client) -> None:  # noqa: ANN001
    """Snappy's block header states the decompressed size: a body claiming more than
    CALVE_MAX_DECOMPRESSED_BYTES is refused on that claim, whatever follows it."""
    claimed = 1 << 30  # a gibibyte, in a body of a few bytes
    body = _varint(claimed) + b"\x00" * 16
    answer = app_client.post("/loki/api/v1/push", content=body, headers={"Content-Type": "application/x-protobuf"})
    assert answer.status_code == 413 and f"decompresses to {claimed} bytes" in answer.json()["detail"], answer.text


def test_a_bulk_document_too_deep_to_encode_goes_to_the_dlq_and_the_rest_is_kept(app_client, redis_url: str) -> None:  # noqa: ANN001
    """Nested 300 levels (orjson reads up to 1,024 but writes only 254): was a 500 for the whole bulk."""
    client = redis.Redis.from_url(redis_url)
    stream = keys.input_stream_key("demo", "logs")
    deep = '{"a":' * 299 + "1" + "}" * 299
    answer = post_bulk(app_client, bulk_body({"index": {"_index": "logs"}}, deep, {"index": {"_index": "logs"}}, {"msg": "kept"}))
    assert answer.status_code == 200, answer.text
    assert [next(iter(i.values()))["status"] for i in answer.json()["items"]] == [201, 201]
    (entry,) = client.xrevrange(stream, count=1)
    first, second = InputEntry.from_fields(*entry).body.split(b"\n")
    assert first.startswith(b"!") and orjson.loads(first[1:])["event"] == deep, "set aside for the DLQ with its original text"
    assert orjson.loads(second) == {"msg": "kept"}


def test_a_bulk_id_beyond_64_bits_is_an_integer_and_keeps_its_digits(app_client, redis_url: str) -> None:  # noqa: ANN001
    """orjson reads 2**64 as a float: the action was refused as '_id a string or an integer'. A
    document's numbers keep their digits too (a decimal a double would round)."""
    ids = {
        "name": "big_ids", "source": {"http": {"path": "/big_ids"}},
        "sinks": [{"table": "big_ids", "auto_create": True, "operation": "op", "identifier_columns": ["id"],
                   "schema": {"columns": [{"name": "id", "type": "string", "required": True}, {"name": "n", "type": "string"}]}}],
    }
    assert app_client.post("/v1/pipelines", json=ids).status_code in (201, 409)
    client = redis.Redis.from_url(redis_url)
    body = (b'{"index":{"_index":"big_ids","_id":18446744073709551616}}\n{"n":123456789012345678901234567890, "m": 1234567890123456.123456}\n'
            b'{"delete":{"_index":"big_ids","_id":-99999999999999999999}}\n')
    answer = post_bulk(app_client, body)
    assert answer.status_code == 200 and not answer.json()["errors"], answer.text
    assert [next(iter(i.values()))["_id"] for i in answer.json()["items"]] == ["18446744073709551616", "-99999999999999999999"]
    (entry,) = client.xrevrange(keys.input_stream_key("demo", "big_ids"), count=1)
    assert InputEntry.from_fields(*entry).body.split(b"\n") == [
        b'{"n":123456789012345678901234567890,"m":1234567890123456.123456,"id":"18446744073709551616","op":"insert"}',
        b'{"id":"-99999999999999999999","op":"delete"}',
    ]


def test_an_otlp_export_keeps_its_readable_records_and_names_the_others_in_partial_success(app_client, redis_url: str) -> None:  # noqa: ANN001
    """One record nested past protobuf's depth limit, or holding a string that is not UTF-8, or an
    id that is not hex, used to make the whole export a 400 (final for an exporter): every record lost."""
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest, ExportLogsServiceResponse

    client = redis.Redis.from_url(redis_url)
    request = ExportLogsServiceRequest()
    resource_logs = request.resource_logs.add()
    resource_logs.resource.attributes.add(key="service.name").value.string_value = "checkout"
    records = resource_logs.scope_logs.add().log_records
    for text in ("first", "deep", "BAD-UTF8", "last"):
        record = records.add(time_unix_nano=1764000000123456789)
        value = record.body
        for _ in range(60 if text == "deep" else 0):
            value = value.array_value.values.add()
        value.string_value = text
    body = request.SerializeToString().replace(b"BAD-UTF8", b"\xff\xfe\xfd-UTF8")  # same length
    answer = app_client.post("/otlp/v1/logs", content=body, headers={"Content-Type": "application/x-protobuf"})
    assert answer.status_code == 200, answer.text
    partial = ExportLogsServiceResponse.FromString(answer.content).partial_success
    assert partial.rejected_log_records == 2
    assert "log record 1: its values nest deeper than" in partial.error_message and "log record 2: a string in it is not valid UTF-8" in partial.error_message
    kept = last_events(client, "otel_logs")
    assert [(event["body"], event["resource_attributes"]) for event in kept] == [("first", {"service.name": "checkout"}), ("last", {"service.name": "checkout"})]

    deep: dict = {"stringValue": "deep"}
    for _ in range(60):
        deep = {"arrayValue": {"values": [deep]}}
    json_records = [{"body": {"stringValue": "one"}}, {"body": deep}, {"traceId": "zz", "body": "bad id"}, {"body": "two"}]
    document = {"resourceLogs": [{"scopeLogs": [{"scope": {"name": "app"}, "logRecords": json_records}]}]}
    answer = app_client.post("/otlp/v1/logs", content=orjson.dumps(document), headers={"Content-Type": "application/json"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["partialSuccess"]["rejectedLogRecords"] == "2"
    assert "log record 2: traceId 'zz' is not hex" in answer.json()["partialSuccess"]["errorMessage"]
    assert [(event["body"], event["scope_name"]) for event in last_events(client, "otel_logs")] == [("one", "app"), ("two", "app")]


def test_single_document_apis_answer_in_elasticsearchs_shape_with_the_bulk_items_rules(app_client, redis_url: str) -> None:  # noqa: ANN001
    client = redis.Redis.from_url(redis_url)
    created = app_client.post("/logs/_doc", content=b'{\n  "msg": "pretty",\n  "n": 1\n}', headers={"Content-Type": "application/json"})
    assert created.status_code == 201 and created.headers["x-elastic-product"] == "Elasticsearch", created.text
    assert created.json()["result"] == "created" and created.json()["_index"] == "logs" and "status" not in created.json()
    assert last_events(client, "logs") == [{"msg": "pretty", "n": 1}]
    assert app_client.put("/logs/_doc/abc", json={"msg": "by id"}).json()["_id"] == "abc"
    missing = app_client.post("/nope/_doc", json={"a": 1})
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "index_not_found_exception" and missing.json()["status"] == 404
    not_object = app_client.post("/logs/_create/1", content=b"[1, 2]", headers={"Content-Type": "application/json"})
    assert not_object.status_code == 400 and not_object.json()["error"]["type"] == "mapper_parsing_exception"
