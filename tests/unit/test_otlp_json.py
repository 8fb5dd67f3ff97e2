"""OTLP/JSON exports read straight from their JSON (otel.json_events) against protobuf's JSON mapping
(otel.parse_request, then otel.events): the same events whenever the direct reading answers, and it
answers for exports as SDKs and Collectors write them."""

from __future__ import annotations

import json

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.pipelines import otel

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
