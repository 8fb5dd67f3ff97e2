"""OTLP/JSON exports read straight from their JSON (otel.json_events) against protobuf's JSON mapping
(otel.parse_request, then otel.events): the same events whenever the direct reading answers, and it
answers for exports as SDKs and Collectors write them. And read column by column (otlp_columns)
against the direct reading: the same lines whenever it answers, and it answers for exports as
exporters write them."""

from __future__ import annotations

import json

import orjson
import pyarrow as pa
import pytest
from google.protobuf import json_format
from google.protobuf.internal.encoder import _VarintBytes
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord

from service.api import otlp_columns
from service.api.events import ParsedBody, made_events
from service.core.exceptions import BodyTooLarge, OtlpError
from service.pipelines import otel
from spark_jobs import otlp_rows

RECEIVED_NS = 1_764_000_000_999_000_000


def by_protobuf(text: bytes) -> tuple[list[dict], list[str]]:
    refused: list[str] = []
    request, refused[:] = otel.parse_request(text, json=True)
    return list(otel.events(request, RECEIVED_NS, refused)), refused


# Values as exporters spell them, and the spellings and kinds the direct reading leaves to protobuf.
texts = st.text(max_size=12)
uint64s = st.one_of(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1).map(str), st.sampled_from(["", "007", "-1", "1e3", "1.5", " 5", "+5"]),
                    st.integers(2**64, 2**70), st.floats(0, 1e19, allow_nan=False), st.booleans(), st.none())
nanos = st.one_of(st.integers(1_500_000_000_000_000_000, 1_900_000_000_000_000_000).map(str), st.integers(0, 2**63), uint64s)
ints = st.one_of(st.integers(-(2**63), 2**63 - 1).map(str), st.integers(-(2**63), 2**63 - 1), st.integers(2**63, 2**64),
                 st.sampled_from(["-", "--5", "5.0", "0x10", "1_000", "-0"]), st.floats(-10, 10, allow_nan=False))
scalars = st.one_of(
    st.builds(lambda v: {"stringValue": v}, st.one_of(texts, st.integers(0, 9))),
    st.builds(lambda v: {"intValue": v}, ints),
    st.builds(lambda v: {"doubleValue": v}, st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(-(2**53), 2**53),
                                                      st.sampled_from(["NaN", "1.5", True]))),
    st.builds(lambda v: {"boolValue": v}, st.one_of(st.booleans(), st.sampled_from(["true", 1]))),
    st.just({}),
    st.just({"bytesValue": "AAE="}),
    st.just({"arrayValue": {"values": [{"stringValue": "a"}, {"boolValue": True}]}}),
    st.just({"kvlistValue": {"values": [{"key": "k", "value": {"intValue": "1"}}]}}),
    st.just({"stringValue": "a", "boolValue": True}),
)
attributes = st.lists(st.one_of(
    st.builds(lambda key, value: {"key": key, "value": value}, st.sampled_from(["host", "http.status", "a", "", "ünï"]), scalars),
    st.builds(lambda key: {"key": key}, st.sampled_from(["host", "no.value"])),
    st.just({"key": "x", "value": None}),
    st.just({"value": {"stringValue": "no key"}}),
), max_size=4)
hex_ids = st.one_of(st.binary(max_size=16).map(bytes.hex), st.binary(min_size=1, max_size=8).map(lambda b: b.hex().upper()),
                    st.sampled_from(["", "zz", "abc", "ab cd"]), st.integers(0, 5), st.none())
bodies = st.one_of(scalars, texts, st.integers(-5, 5), st.booleans(), st.floats(-2, 2, allow_nan=False), st.lists(st.integers(0, 3), max_size=2),
                   st.just({"message": "x"}), st.none())
record_fields = {
    "timeUnixNano": nanos, "observedTimeUnixNano": nanos,
    "severityNumber": st.one_of(st.integers(0, 24), st.integers(25, 30), st.sampled_from(["SEVERITY_NUMBER_INFO", "9", True, -1])),
    "severityText": st.one_of(texts, st.integers(0, 3)), "body": bodies, "attributes": attributes,
    "droppedAttributesCount": st.one_of(st.integers(0, 3), st.just("2"), st.just(-1)),
    "flags": st.one_of(st.integers(0, 2**32 - 1), st.just("1"), st.integers(2**32, 2**33)),
    "traceId": hex_ids, "spanId": hex_ids, "eventName": st.one_of(texts, st.none()),
    "time_unix_nano": nanos, "unknownField": st.just(1),
}
# Records as exporters write them (read directly), or with any of the above (left to protobuf).
plain_scalars = st.one_of(st.builds(lambda v: {"stringValue": v}, texts), st.builds(lambda v: {"intValue": str(v)}, st.integers(-(2**63), 2**63 - 1)),
                          st.builds(lambda v: {"doubleValue": v}, st.floats(allow_nan=False, allow_infinity=False)),
                          st.builds(lambda v: {"boolValue": v}, st.booleans()))
plain_fields = {
    "timeUnixNano": st.integers(1_500_000_000_000_000_000, 1_900_000_000_000_000_000).map(str), "observedTimeUnixNano": st.integers(0, 2**62),
    "severityNumber": st.integers(0, 24), "severityText": texts, "body": st.one_of(plain_scalars, texts),
    "attributes": st.lists(st.builds(lambda key, value: {"key": key, "value": value}, st.sampled_from(["host", "a", "", "ünï"]), plain_scalars), max_size=4),
    "flags": st.integers(0, 255), "traceId": st.binary(max_size=16).map(bytes.hex), "spanId": st.binary(max_size=8).map(bytes.hex), "eventName": texts,
}
records = st.one_of(st.fixed_dictionaries({}, optional=plain_fields), st.fixed_dictionaries({}, optional=record_fields))
scopes = st.fixed_dictionaries({}, optional={"name": st.one_of(texts, st.integers(0, 2)), "version": texts, "attributes": attributes,
                                             "droppedAttributesCount": st.integers(0, 2)})
documents = st.builds(
    lambda resource_logs: {"resourceLogs": resource_logs},
    st.lists(st.fixed_dictionaries({"scopeLogs": st.lists(st.fixed_dictionaries(
        {"logRecords": st.lists(records, max_size=3)}, optional={"scope": scopes, "schemaUrl": texts},
    ), max_size=2)}, optional={"resource": st.fixed_dictionaries({}, optional={"attributes": attributes}), "schemaUrl": texts}), max_size=2),
)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents)
def test_the_direct_reading_of_otlp_json_gives_protobufs_events_or_leaves_the_export_to_it(document: dict) -> None:
    text = json.dumps(document).encode()  # integers beyond 64 bits too, which orjson reads as floats
    direct = otel.json_events(orjson.loads(text), RECEIVED_NS)
    if direct is None:
        return
    events, refused = by_protobuf(text)
    assert not refused, f"the direct reading took an export protobuf's refuses records of: {refused}"
    assert [orjson.dumps(event) for event in direct] == [orjson.dumps(event) for event in events]


def test_exports_as_sdks_and_collectors_write_them_are_read_directly() -> None:
    """Every field of a LogRecord, attributes of the four scalar kinds, two resources: read without protobuf."""
    record = {
        "timeUnixNano": "1764000000123456789", "observedTimeUnixNano": 1764000000200000000, "severityNumber": 17,
        "severityText": "ERROR", "body": {"stringValue": "payment failed"}, "droppedAttributesCount": 0, "flags": 1,
        "traceId": "5B8EFFF798038103D269B633813FC60C", "spanId": "eee19b7ec3c1b174", "eventName": "payment",
        "attributes": [{"key": "order", "value": {"intValue": "42"}}, {"key": "ratio", "value": {"doubleValue": 1}},
                       {"key": "ok", "value": {"boolValue": False}}, {"key": "user", "value": {"stringValue": "ann"}}, {"key": "none"}],
    }
    document = {"resourceLogs": [
        {"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "checkout"}}]},
         "scopeLogs": [{"scope": {"name": "app", "version": "1.2"}, "logRecords": [record, {"body": "bare"}]}], "schemaUrl": "https://x"},
        {"scopeLogs": [{"logRecords": [{"timeUnixNano": 1764000001000000000}]}]},
    ]}
    direct = otel.json_events(orjson.loads(orjson.dumps(document)), RECEIVED_NS)
    assert direct is not None, "the direct reading left an export as exporters write it to protobuf"
    assert direct == by_protobuf(orjson.dumps(document))[0]
    assert direct[0]["attributes"] == {"order": "42", "ratio": "1.0", "ok": "false", "user": "ann", "none": "null"}
    assert direct[0]["trace_id"] == "5b8efff798038103d269b633813fc60c" and direct[1]["body"] == "bare"
    assert direct[2] == {"timestamp": "2025-11-24T16:00:01.000000Z", "attributes": {}, "resource_attributes": {}}


def by_records(text: bytes) -> ParsedBody | None:
    direct = otel.json_events(orjson.loads(text), RECEIVED_NS)
    return None if direct is None else made_events(direct, 10_000)


def same_lines(columns: ParsedBody | None, expected: ParsedBody | None) -> bool:
    """Whether the column reading's rows (an Arrow IPC stream: spark_jobs/otlp_rows.py) write the
    per-record way's lines byte for byte, but for each map's keys, in key order there."""
    if columns is None or expected is None:
        return columns is expected

    def key_ordered(line: bytes) -> bytes:
        event = orjson.loads(line)
        for name in ("attributes", "resource_attributes"):
            if name in event:
                event[name] = dict(sorted(event[name].items()))
        return orjson.dumps(event)

    written = otlp_rows.lines(otlp_rows.from_ipc(columns.ndjson)) if otlp_rows.is_rows(columns.ndjson) else columns.ndjson
    return (written, columns.events, columns.set_aside) == (
        b"\n".join(map(key_ordered, expected.ndjson.split(b"\n"))), expected.events, expected.set_aside)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents, st.booleans())
def test_the_column_reading_of_otlp_json_gives_the_direct_readings_lines_or_leaves_the_export_to_it(document: dict, pretty: bool) -> None:
    """otlp_columns.json_body answers only where json_events does, with the same lines byte for byte."""
    text = json.dumps(document, indent=1 if pretty else None).encode()
    columns = otlp_columns.json_body(text, RECEIVED_NS, 10_000)
    if columns is not None:
        assert same_lines(columns, by_records(text))


exporter_texts = st.text(st.characters(codec="utf-8", exclude_characters="\ud800"), max_size=12).filter(lambda text: "null" not in text)
exporter_scalars = st.one_of(
    st.builds(lambda v: {"stringValue": v}, exporter_texts), st.builds(lambda v: {"intValue": str(v)}, st.integers(-(10**18), 10**19 - 1)),
    st.builds(lambda v: {"doubleValue": v}, st.floats(allow_nan=False, allow_infinity=False, width=64)),
    st.builds(lambda v: {"boolValue": v}, st.booleans()), st.just({}),
)
exporter_attributes = st.lists(st.builds(lambda key, value: {"key": key, "value": value}, exporter_texts, exporter_scalars),
                               max_size=4, unique_by=lambda pair: pair["key"])
exporter_records = st.fixed_dictionaries({}, optional={
    "timeUnixNano": st.integers(0, 10**19 - 1).map(str), "observedTimeUnixNano": st.integers(0, 10**19 - 1).map(str),
    "severityNumber": st.integers(0, 24), "severityText": exporter_texts, "body": exporter_scalars, "attributes": exporter_attributes,
    "droppedAttributesCount": st.integers(0, 2**32 - 1), "flags": st.integers(0, 2**32 - 1),
    "traceId": st.binary(max_size=16).map(bytes.hex), "spanId": st.binary(max_size=8).map(lambda b: b.hex().upper()), "eventName": exporter_texts,
})
exporter_documents = st.builds(
    lambda resource_logs: {"resourceLogs": resource_logs},
    st.lists(st.fixed_dictionaries({"scopeLogs": st.lists(st.fixed_dictionaries({"logRecords": st.lists(exporter_records, min_size=1, max_size=4)}, optional={
        "scope": st.fixed_dictionaries({}, optional={"name": exporter_texts, "version": exporter_texts, "attributes": exporter_attributes}),
        "schemaUrl": exporter_texts,
    }), min_size=1, max_size=2)}, optional={"resource": st.fixed_dictionaries({}, optional={"attributes": exporter_attributes})}), min_size=1, max_size=2),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(exporter_documents)
def test_exports_as_exporters_write_them_are_read_column_by_column(document: dict) -> None:
    """Every field in every spelling an exporter uses, any text (quotes, control characters, any
    script), doubles of any size: read the column way, with the per-record way's lines. (Not a run
    of 20 digits or a minus and 19 anywhere: it may be an integer orjson reads as a float, and the
    column reading leaves the export to the per-record way.)"""
    text = orjson.dumps(document)
    if b"null" in text or otel.json_events(orjson.loads(text), RECEIVED_NS) is None:
        return  # a JSON null (an empty key's "value": {} is not one); json_events leaves a time past year 9999 to protobuf
    columns = otlp_columns.json_body(text, RECEIVED_NS, 10_000)
    assert columns is not None, "the column reading left an export as exporters write it to the per-record way"
    assert same_lines(columns, by_records(text))


def test_the_column_reading_leaves_what_it_cannot_hold_exactly_to_the_per_record_way() -> None:
    """A duplicate attribute key (a dict keeps its first place and last value), a JSON null, an
    int64 as a JSON number, NaN, two JSON values, bytes that are not UTF-8: no answer, and the
    per-record way decides."""
    record = {"timeUnixNano": "1764000000123456789", "attributes": [{"key": "a", "value": {"stringValue": "1"}}]}

    def export(**changes: object) -> bytes:
        return orjson.dumps({"resourceLogs": [{"scopeLogs": [{"logRecords": [{**record, **changes}]}]}]})

    assert same_lines(otlp_columns.json_body(export(), RECEIVED_NS, 10), by_records(export()))  # the control: answered
    twice = export(attributes=[{"key": "a", "value": {"stringValue": "1"}}, {"key": "b"}, {"key": "a", "value": {"intValue": "2"}}])
    assert otlp_columns.json_body(twice, RECEIVED_NS, 10) is None and orjson.loads(by_records(twice).ndjson)["attributes"] == {"a": "2", "b": "null"}
    for text in (export(severityText=None), export(timeUnixNano=1764000000123456789), export().replace(b'"1"}', b'NaN}'),
                 export() + b"\n" + export(), export(severityText="caf\xe9").replace("é".encode(), b"\xe9")):
        assert otlp_columns.json_body(text, RECEIVED_NS, 10) is None, text
    with pytest.raises(BodyTooLarge):
        otlp_columns.json_body(export(), RECEIVED_NS, 0)


def test_long_integers_are_looked_for_only_where_a_double_may_be_one() -> None:
    """A run of 20 digits in a text is only text: read the column way. A doubleValue written as an
    integer of 20 digits or more (orjson reads it past 64 bits as a float): the per-record way's
    lines, or left to it."""
    def export(value: bytes) -> bytes:
        return (b'{"resourceLogs":[{"scopeLogs":[{"logRecords":[{"timeUnixNano":"1764000000123456789","body":'
                + value + b',"attributes":[{"key":"a","value":{"doubleValue":2.5}}]}]}]}]}')

    in_text = export(b'{"stringValue":"id:123456789012345678901234, -1234567890123456789"}')
    columns = otlp_columns.json_body(in_text, RECEIVED_NS, 10)
    assert columns is not None and same_lines(columns, by_records(in_text))
    for number in (b"123456789012345678901234", b"18446744073709551616", b"-9223372036854775809"):  # integers: left to it
        assert otlp_columns.json_body(export(b'{"doubleValue":' + number + b"}"), RECEIVED_NS, 10) is None, number
    for number in (b"1.5e20", b"-1e18", b"1234567890123456789.5"):  # as large, but no integer's digits: read the column way
        text = export(b'{"doubleValue":' + number + b"}")
        columns = otlp_columns.json_body(text, RECEIVED_NS, 10)
        assert columns is not None and same_lines(columns, by_records(text)), number


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(documents, exporter_documents))
@example({"resourceLogs": [{"resource": {"attributes": [{"key": "r", "value": {"bytesValue": "AAE="}}]}, "scopeLogs": [{"logRecords": [
    {"body": {"arrayValue": {"values": [{"stringValue": "a"}, {"doubleValue": 1.5}]}}, "attributes": [
        {"key": "b", "value": {"bytesValue": "AAE="}}, {"key": "k", "value": {"kvlistValue": {"values": [{"key": "x", "value": {"intValue": "1"}}]}}},
        {"key": "n", "value": {"doubleValue": "NaN"}}, {"key": "s", "value": {"stringValue": "plain"}}, {"key": "e"}]},
    {"body": {"doubleValue": "-Infinity"}, "traceId": "0A1b", "attributes": [{"key": "d", "value": {"doubleValue": 0.1}}]},
]}]}]}).via("every kind read value by value from the wire, amid plain ones")
def test_protobuf_exports_read_column_by_column_give_the_per_record_lines(document: dict) -> None:
    """otlp_columns.protobuf_body against otel.events of the same request (any AnyValue kind, a
    key twice, empty strings): the same lines whenever it answers, and it answers unless a
    record's attributes hold a key twice or a double is NaN or infinite."""
    text = json.dumps(document).encode()
    try:
        request, refused = otel.parse_request(text, json=True)
    except OtlpError:
        return  # not an export protobuf reads
    if refused:
        return
    columns = otlp_columns.protobuf_body(request, RECEIVED_NS, 10_000)
    by_events = made_events(otel.events(request, RECEIVED_NS, refused), 10_000)
    twice = any(len({pair.key for pair in pairs}) < len(pairs) for resource in request.resource_logs
                for pairs in [resource.resource.attributes, *(record.attributes for scope in resource.scope_logs for record in scope.log_records)])
    assert same_lines(columns, by_events) or (columns is None and (twice or b"NaN" in text or b"Infinity" in text))
    # Read from its wire bytes (ptars): the same lines, NaN and infinities, bytes, lists and objects included.
    wire = request.SerializeToString()
    assert otlp_columns._wire_records(wire, request, RECEIVED_NS) is not otlp_columns._NOT_READ
    from_wire = otlp_columns.protobuf_body(request, RECEIVED_NS, 10_000, wire)
    assert same_lines(from_wire, by_events) or (from_wire is None and twice)


def _length_delimited(field: int, payload: bytes) -> bytes:
    return _VarintBytes(field << 3 | 2) + _VarintBytes(len(payload)) + payload


def test_a_protobuf_export_read_from_its_wire_bytes_only_where_protobuf_would_write_them_so() -> None:
    """A message field sent twice is one message, merged (protobuf's rule): a record whose body is
    sent as a string and then as an integer holds the integer. Read from the wire bytes, it held
    the string; such an export (upb writes it back in fewer bytes) is read field by field. A field
    sent twice otherwise, an unknown field or a known one of the wrong wire type: as protobuf reads them."""
    records = {
        "a body twice": LogRecord(time_unix_nano=1, body=AnyValue(string_value="a")).SerializeToString() + LogRecord(body=AnyValue(int_value=5)).SerializeToString(),
        "a severity twice": LogRecord(severity_number=3).SerializeToString() + LogRecord(severity_number=9).SerializeToString(),
        "an unknown field": LogRecord(severity_number=3).SerializeToString() + b"\xa8\x06\x01",  # field 101, a varint
        "a string sent as a fixed32": LogRecord(severity_number=3).SerializeToString() + b"\x1d\x00\x00\x00\x00",
    }
    for name, record in records.items():
        wire = _length_delimited(1, _length_delimited(2, _length_delimited(2, record)))
        request = ExportLogsServiceRequest.FromString(wire)
        by_events = made_events(otel.events(request, RECEIVED_NS, []), 10)
        assert same_lines(otlp_columns.protobuf_body(request, RECEIVED_NS, 10, wire), by_events), name
    merged = ExportLogsServiceRequest.FromString(wire := _length_delimited(1, _length_delimited(2, _length_delimited(2, records["a body twice"]))))
    assert merged.resource_logs[0].scope_logs[0].log_records[0].body.int_value == 5
    unmerged = otlp_columns._wire_records(wire, merged, RECEIVED_NS)
    assert unmerged.body.to_pylist() == ["a"], "the wire reading does not merge: why the export's size is looked at first"


@settings(max_examples=400, deadline=None)
@given(st.lists(st.text("0123456789-+ .e٣", max_size=22), min_size=1, max_size=5))
@example(["1" * 20]).via("the longest time")
@example(["1" * 21]).via("one digit too many")
@example(["-" + "1" * 19]).via("the longest negative intValue")
@example(["-" + "1" * 20]).via("a negative one digit too long")
@example(["-", "--5", "-0", "5-"]).via("minus signs")
def test_the_column_readings_digit_checks_take_what_the_per_record_way_takes(texts: list[str]) -> None:
    """otlp_columns._digits (compute calls, not a regular expression) against otel's checks of a
    time's digits (_uint: 1 to 20 digits) and an intValue's (a minus and 1 to 19, or 1 to 20)."""

    def uint(text: str) -> bool:
        try:
            otel._uint(text, 64 if len(text) < 20 else 70)  # its digit rule, whatever the range
        except otel._NotPlain:
            return False
        return True

    def int_value(text: str) -> bool:
        return text not in ("", "-") and len(text) <= 20 and otel._DIGITS.issuperset(text.removeprefix("-"))  # otel._any_value_text's

    assert otlp_columns._digits(pa.array(texts)) == all(map(uint, texts))
    assert otlp_columns._digits(pa.array(texts), signed=True) == all(map(int_value, texts))


def test_a_protobuf_export_ptars_cannot_read_is_read_field_by_field(monkeypatch) -> None:  # noqa: ANN001
    """ptars refusing the bytes (ValueError), or panicking in its Rust (pyo3's PanicException, a
    BaseException): the export's fields are gathered from the parsed messages instead. A fake
    ptars: no input is known to make the real one panic."""
    document = {"resourceLogs": [{"scopeLogs": [{"logRecords": [{"body": {"stringValue": "hello"}, "severityNumber": 9}]}]}]}
    request, _ = otel.parse_request(json.dumps(document).encode(), json=True)
    wire = request.SerializeToString()
    expected = made_events(otel.events(request, RECEIVED_NS, []), 10)

    class PanicException(BaseException):
        pass

    for fault in (ValueError("failed to decode Protobuf message"), PanicException("index out of bounds")):
        class Failing:
            def list_to_record_batch(self, _payloads: list, fault: BaseException = fault) -> None:
                raise fault

        monkeypatch.setattr(otlp_columns, "_export_wire", Failing)
        assert otlp_columns._wire_records(wire, request, RECEIVED_NS) is otlp_columns._NOT_READ
        assert same_lines(otlp_columns.protobuf_body(request, RECEIVED_NS, 10, wire), expected)


def test_a_small_export_is_read_record_by_record_and_a_large_one_column_by_column() -> None:
    """routes/otlp.py `_events`: an export of fewer than COLUMNS_FROM_RECORDS records (JSON:
    its objects counted) is read record by record (column by column it cost the api ~100 times
    as much for one record), a larger one column by column; in JSON and in protobuf, each gives
    the per-record way's events."""
    from service.api.routes.otlp import COLUMNS_FROM_RECORDS, _events

    def export(records: int) -> dict:
        return {"resourceLogs": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "api"}}]}, "scopeLogs": [{
            "scope": {"name": "app"}, "logRecords": [{
                "timeUnixNano": str(1_764_000_000_000_000_000 + k), "severityNumber": 9, "body": {"stringValue": f"record {k}"},
                "attributes": [{"key": "n", "value": {"intValue": str(k)}}, {"key": "host", "value": {"stringValue": "web-1"}},
                               {"key": "ms", "value": {"doubleValue": k / 4}}],
            } for k in range(records)]}]}]}

    def events_of(read: list[dict] | ParsedBody) -> list[dict]:  # each map in key order (the columns' lines have them so)
        lines = made_events(read, 10_000).ndjson if isinstance(read, list) else read.ndjson
        lines = otlp_rows.lines(otlp_rows.from_ipc(lines)) if otlp_rows.is_rows(lines) else lines
        return [{name: dict(sorted(value.items())) if isinstance(value, dict) else value for name, value in orjson.loads(line).items()}
                for line in lines.split(b"\n")]

    for records, by_columns in ((1, False), (COLUMNS_FROM_RECORDS // 2, False), (COLUMNS_FROM_RECORDS, True)):
        document = export(records)
        text = orjson.dumps(document)
        wire = json_format.ParseDict(document, ExportLogsServiceRequest())
        expected = events_of(otel.json_events(orjson.loads(text), RECEIVED_NS))
        assert len(expected) == records
        for body, is_json in ((text, True), (wire.SerializeToString(), False)):
            read = _events(body, is_json, RECEIVED_NS, [], 10_000)
            columns = isinstance(read, ParsedBody) and otlp_rows.is_rows(read.ndjson)
            assert columns == by_columns and (columns or isinstance(read, list)), (records, is_json)
            assert events_of(read) == expected, (records, is_json)
