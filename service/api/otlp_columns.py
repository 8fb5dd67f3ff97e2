"""OTLP exports read column by column: the events the per-record way makes (`otel.json_events`,
or `otel.events` of a parsed protobuf request, then `made_events`), for a fraction of its CPU.

JSON: pyarrow's JSON reader parses the export against the one schema exporters write (camelCase
names, int64s as decimal strings, enums as integers, AnyValues of one scalar kind), refusing any
other field or type. Protobuf: upb parses it, and each field is gathered into a list in one pass
over the records. pyarrow's compute functions then make the records' rows in the otel_logs
table's columns (spark_jobs/otlp_rows.py), buffered as an Arrow IPC stream: a short-way task
writes them as they are, and anything else reads their lines (otlp_rows.lines: the per-record
way's, but for each map's keys, in key order). Anything this reading does not hold exactly as the
per-record way does (another spelling, a JSON null, a key twice in one record's attributes, a
value out of range, text orjson would refuse) answers None, and the per-record way reads the
export and decides what it becomes. Differential tests in tests/unit/test_otlp_json.py and
tests/unit/test_otlp_rows.py keep both alike, line by line and row by row.

Measured on `make bench`'s bodies (1,000 records, three attributes each), one process: OTLP/JSON
6.9 against 17.6 microseconds per record, protobuf 7.5 against 10.6, when it wrote the lines;
the rows cost 1.1 ms per 1,000 records against 3.4 for the lines (README, the `otlp` shape's
measurements under "The two commands").
"""
from __future__ import annotations

import functools
import io
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import orjson
import ptars
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from service.api.events import MAX_FIELD_NAME, ParsedBody, may_hold_long_integers, too_many_events
from service.pipelines import otel
from spark_jobs import otlp_rows

_VALUE = pa.struct([("stringValue", pa.string()), ("intValue", pa.string()), ("doubleValue", pa.float64()), ("boolValue", pa.bool_())])
_ATTRIBUTES = pa.list_(pa.struct([("key", pa.string()), ("value", _VALUE)]))
_RECORD = pa.struct([
    ("timeUnixNano", pa.string()), ("observedTimeUnixNano", pa.string()), ("severityNumber", pa.int64()), ("severityText", pa.string()),
    ("body", _VALUE), ("attributes", _ATTRIBUTES), ("droppedAttributesCount", pa.int64()), ("flags", pa.int64()),
    ("traceId", pa.string()), ("spanId", pa.string()), ("eventName", pa.string()),
])
_SCOPE = pa.struct([("name", pa.string()), ("version", pa.string()), ("attributes", _ATTRIBUTES), ("droppedAttributesCount", pa.int64())])
_EXPORT = pa.schema([("resourceLogs", pa.list_(pa.struct([
    ("resource", pa.struct([("attributes", _ATTRIBUTES), ("droppedAttributesCount", pa.int64())])),
    ("scopeLogs", pa.list_(pa.struct([("scope", _SCOPE), ("logRecords", pa.list_(_RECORD)), ("schemaUrl", pa.string())]))),
    ("schemaUrl", pa.string()),
])))])
_PARSE = pj.ParseOptions(explicit_schema=_EXPORT, unexpected_field_behavior="error")
_HEX_ID = r"^([0-9a-fA-F]{2})*$"
# A number of 20 digits or more without a fraction or an exponent (may_hold_long_integers looks
# first, at memory speed: a double's digits trigger it too). Only a doubleValue can take one (pyarrow
# refuses it anywhere else): the text is searched only when a double read is that large.
_LARGEST_SHORT = 1e18  # below any integer of 19 digits or more
_LONG_INTEGER = re.compile(rb"[:,\[]\s*-?[0-9]{19,}(?![0-9.eE])")


class _NotPlain(Exception):
    """Something this reading does not hold as json_events does: the per-record way reads it."""


@dataclass(frozen=True)
class _Attributes:
    """Lists of key-value pairs, one list per owner (a record or a resource): `offsets` into `keys`
    and `texts` (each value's text, as otel.value_text writes it)."""

    offsets: pa.Array
    keys: pa.Array
    texts: pa.Array


@dataclass(frozen=True)
class _Records:
    """An export's log records as columns, each holding what otel.events takes from it: 0, "" or
    null where a record has no such field."""

    time: pa.Array  # uint64 nanoseconds, the observed time or the time received already put in where it has none
    observed: pa.Array  # uint64
    severity: pa.Array  # int64
    severity_text: pa.Array
    body: pa.Array  # its text, null for none
    attributes: _Attributes
    trace_id: pa.Array  # lower-case hex
    span_id: pa.Array
    flags: pa.Array  # int64
    event_name: pa.Array
    scope: pa.Array  # each record's scope's index into scope_name and scope_version
    scope_name: pa.Array
    scope_version: pa.Array
    resource: pa.Array  # each record's resource's index into resource_attributes' lists
    resource_attributes: _Attributes


def json_body(body: bytes, received_ns: int, max_events: int) -> ParsedBody | None:
    """The export's events as the writer's lines, exactly those `made_events(json_events(...))`
    gives; None when this reading cannot say so (the caller reads the export the per-record way).
    BodyTooLarge past `max_events` records, as made_events says."""
    if b"null" in body:
        return None  # a JSON null reads as an absent field here, not there
    try:
        body.decode()  # pyarrow passes bytes that are not UTF-8 through; orjson refuses them
        table = pj.read_json(io.BytesIO(body), read_options=pj.ReadOptions(use_threads=False, block_size=max(len(body), 1 << 16) + 1),
                             parse_options=_PARSE)
    except (UnicodeDecodeError, pa.ArrowInvalid):
        return None
    if table.num_rows != 1:
        return None  # more than one JSON value (orjson refuses it), or none
    try:
        return _parsed(_json_records(table.column(0).combine_chunks(), received_ns, body), max_events)
    except (_NotPlain, pa.ArrowInvalid):
        return None


def protobuf_body(request: ExportLogsServiceRequest, received_ns: int, max_events: int, body: bytes | None = None) -> ParsedBody | None:
    """The export's events as the writer's lines, exactly those `made_events(events(request, ...))`
    gives; None when this reading cannot say so (a key twice in one record's attributes, a key
    too long to be a field name, a double NaN or infinite). BodyTooLarge past `max_events`
    records. `body`: the bytes `request` was parsed from, read into columns straight from the
    wire (_wire_records) where protobuf would write them so; else field by field from `request`."""
    try:
        records = _wire_records(body, request, received_ns) if body is not None and request.ByteSize() == len(body) else _NOT_READ
        return _parsed(_protobuf_records(request, received_ns) if records is _NOT_READ else records, max_events)
    except _NotPlain:
        return None


def _parsed(records: _Records | None, max_events: int) -> ParsedBody | None:
    if records is None:
        return None
    count = len(records.time)
    if count > max_events:
        raise too_many_events(max_events)
    return ParsedBody(ndjson=otlp_rows.to_ipc(_rows(records)), events=count)


def _json_records(resource_logs: pa.ListArray, received_ns: int, body: bytes) -> _Records | None:
    """The records of an export pyarrow read from `body`, checked as json_events checks them
    (_NotPlain where it would answer None, or pyarrow's ArrowInvalid)."""
    resources = resource_logs.flatten()
    if not len(resources):
        return None
    resource = resources.field("resource")
    _check_uint(resource.field("droppedAttributesCount"), 32)
    resource_attributes = _json_attributes(resource.field("attributes"), body)
    scope_lists = resources.field("scopeLogs")
    scopes = scope_lists.flatten()
    scope_resource = pc.list_parent_indices(scope_lists)
    scope = scopes.field("scope")
    _check_uint(scope.field("droppedAttributesCount"), 32)
    _json_attributes(scope.field("attributes"), body)  # checked as json_events checks them, then unused
    record_lists = scopes.field("logRecords")
    records = record_lists.flatten()
    if not len(records):
        return None
    record_scope = pc.list_parent_indices(record_lists)
    observed = _uint(records.field("observedTimeUnixNano"), 64)
    time = _uint(records.field("timeUnixNano"), 64)
    time = _or_else(time, _or_else(observed, pa.scalar(received_ns, pa.uint64())))  # a record without a time: when observed, else received
    severity = pc.fill_null(records.field("severityNumber"), 0)
    if not pc.all(pc.and_(pc.greater_equal(severity, 0), pc.less_equal(severity, 24))).as_py():
        raise _NotPlain
    _check_uint(records.field("droppedAttributesCount"), 32)
    flags = pc.fill_null(records.field("flags"), 0)
    _check_uint(flags, 32)
    return _Records(
        time=time, observed=observed, severity=severity, severity_text=records.field("severityText"),
        body=_value_texts(records.field("body"), body, empty=None), attributes=_json_attributes(records.field("attributes"), body),
        trace_id=_hex_id(records.field("traceId")), span_id=_hex_id(records.field("spanId")), flags=flags,
        event_name=records.field("eventName"), scope=record_scope, scope_name=scope.field("name"), scope_version=scope.field("version"),
        resource=pc.take(scope_resource, record_scope), resource_attributes=resource_attributes,
    )


def _json_attributes(attributes: pa.ListArray, body: bytes) -> _Attributes:
    """KeyValues as pyarrow read them, checked as otel._json_attributes checks them: _NotPlain for
    a pair without a key or a value of two kinds."""
    pairs = attributes.flatten()  # an absent list: empty (a JSON null never reaches here)
    keys = pairs.field("key")
    if keys.null_count:
        raise _NotPlain
    offsets = attributes.offsets
    return _Attributes(offsets=pc.subtract(offsets, offsets[0]), keys=keys, texts=_value_texts(pairs.field("value"), body, empty="null"))


def _protobuf_records(request: ExportLogsServiceRequest, received_ns: int) -> _Records | None:
    """The records of a parsed export, read field by field."""
    columns: dict[str, list] = {name: [] for name in ("time", "observed", "severity", "severity_text", "body", "trace_id", "span_id", "flags",
                                                      "event_name", "scope", "scope_name", "scope_version", "resource")}
    attributes: tuple[list, list, list] = ([0], [], [])
    offsets, keys, texts = attributes
    double_at: list[int] = []  # where in texts each of doubles goes
    doubles: list[float] = []
    value_text = otel.value_text
    time_append, observed_append, severity_append = columns["time"].append, columns["observed"].append, columns["severity"].append
    severity_text_append, body_append, trace_append = columns["severity_text"].append, columns["body"].append, columns["trace_id"].append
    span_append, flags_append, event_name_append = columns["span_id"].append, columns["flags"].append, columns["event_name"].append
    resource_attributes: tuple[list, list, list] = ([0], [], [])
    for resource_index, resource_logs in enumerate(request.resource_logs):
        _gather_attributes(resource_logs.resource.attributes, resource_attributes)
        for scope_logs in resource_logs.scope_logs:
            records = scope_logs.log_records
            if not records:
                continue
            scope = scope_logs.scope
            columns["scope"] += [len(columns["scope_name"])] * len(records)
            columns["scope_name"].append(scope.name)
            columns["scope_version"].append(scope.version)
            columns["resource"] += [resource_index] * len(records)
            for record in records:  # one pass: each access to a record makes its Python object anew
                time_append(record.time_unix_nano)
                observed_append(record.observed_time_unix_nano)
                severity_append(record.severity_number)
                severity_text_append(record.severity_text)
                body = record.body
                body_append(None if (kind := body.WhichOneof("value")) is None else body.string_value if kind == "string_value" else value_text(body))
                trace_append(record.trace_id.hex())
                span_append(record.span_id.hex())
                flags_append(record.flags)
                event_name_append(record.event_name)
                for pair in record.attributes:
                    keys.append(pair.key)
                    value = pair.value
                    kind = value.WhichOneof("value")
                    if kind == "string_value":
                        texts.append(value.string_value)
                    elif kind == "double_value":  # written all at once below
                        double_at.append(len(texts))
                        doubles.append(value.double_value)
                        texts.append(None)
                    else:
                        texts.append(value_text(value))
                offsets.append(len(keys))
    if not columns["time"]:
        return None
    if doubles:
        for at, text in zip(double_at, _double_texts(pa.array(doubles, pa.float64())).to_pylist()):
            texts[at] = text
    observed = pa.array(columns["observed"], pa.uint64())
    time = pa.array(columns["time"], pa.uint64())
    time = _or_else(time, _or_else(observed, pa.scalar(received_ns, pa.uint64())))  # a record without a time: when observed, else received
    return _Records(
        time=time, observed=observed, severity=pa.array(columns["severity"], pa.int64()), severity_text=pa.array(columns["severity_text"], pa.string()),
        body=pa.array(columns["body"], pa.string()), attributes=_Attributes(*(pa.array(values, type_) for values, type_ in zip(attributes, _PAIRS))),
        trace_id=pa.array(columns["trace_id"], pa.string()), span_id=pa.array(columns["span_id"], pa.string()),
        flags=pa.array(columns["flags"], pa.int64()), event_name=pa.array(columns["event_name"], pa.string()),
        scope=pa.array(columns["scope"], pa.int32()), scope_name=pa.array(columns["scope_name"], pa.string()),
        scope_version=pa.array(columns["scope_version"], pa.string()), resource=pa.array(columns["resource"], pa.int32()),
        resource_attributes=_Attributes(*(pa.array(values, type_) for values, type_ in zip(resource_attributes, _PAIRS))),
    )


_PAIRS = (pa.int32(), pa.string(), pa.string())
_NOT_READ = object()  # _wire_records could not read the export: _protobuf_records does
_HEX_DIGITS = np.frombuffer(b"0123456789abcdef", np.uint8)
_SCALARS = ("string_value", "int_value", "double_value", "bool_value")  # AnyValue's kinds read as columns; the others value by value


@functools.cache
def _export_wire() -> ptars.MessageHandler:
    # What _wire_records and _hex take as given, said rather than left to ptars's defaults:
    # enums as their integers, 32-bit offsets for strings, bytes and lists.
    config = ptars.PtarsConfig(enum_repr="int32", use_large_string=False, use_large_binary=False, use_large_list=False)
    pool = ptars.HandlerPool([ExportLogsServiceRequest.DESCRIPTOR.file], config=config)
    return pool.get_for_message(ExportLogsServiceRequest.DESCRIPTOR)


def _wire_records(body: bytes, request: ExportLogsServiceRequest, received_ns: int) -> _Records | None | object:
    """_protobuf_records of `request`, read by ptars from `body`, the wire bytes upb parsed it from,
    into Arrow columns in one call (Rust; no message object a record or a field): 1.8 ms for 1,000
    records of make bench's exports (ptars 0.9 of it) against 5-6 ms field by field. Only where upb writes `request` back in as many bytes
    (the caller looks): a field or message sent twice, which upb merges and this reading may not,
    writes fewer. _NOT_READ where ptars cannot read them. Values of the kinds not in _SCALARS (lists,
    objects, bytes, a NaN) are taken from `request`, one by one."""
    try:
        export = _export_wire().list_to_record_batch([body]).column(0)
    except (ValueError, pa.ArrowException):
        return _NOT_READ
    except BaseException as exc:  # a panic in ptars's Rust reaches Python as pyo3's PanicException, a BaseException
        if type(exc).__name__ != "PanicException":
            raise
        return _NOT_READ
    resources = export.flatten()
    if not len(resources):
        return None
    resource = resources.field("resource")
    resource_attributes = _wire_attributes(resource.field("attributes"), lambda: [r.resource.attributes for r in request.resource_logs])
    scope_lists = resources.field("scope_logs")
    scopes = scope_lists.flatten()
    scope = scopes.field("scope")
    record_lists = scopes.field("log_records")
    records = record_lists.flatten()
    if not len(records):
        return None
    record_scope = pc.list_parent_indices(record_lists)
    in_order = functools.cache(lambda: [record for resource_logs in request.resource_logs for scope_logs in resource_logs.scope_logs
                                        for record in scope_logs.log_records])
    observed = records.field("observed_time_unix_nano")
    time = _or_else(records.field("time_unix_nano"), _or_else(observed, pa.scalar(received_ns, pa.uint64())))
    return _Records(
        time=time, observed=observed, severity=pc.cast(records.field("severity_number"), pa.int64()), severity_text=records.field("severity_text"),
        body=_wire_texts(records.field("body"), lambda: [record.body for record in in_order()], None),
        attributes=_wire_attributes(records.field("attributes"), lambda: [record.attributes for record in in_order()]),
        trace_id=_hex(records.field("trace_id")), span_id=_hex(records.field("span_id")), flags=pc.cast(records.field("flags"), pa.int64()),
        event_name=records.field("event_name"), scope=record_scope, scope_name=scope.field("name"), scope_version=scope.field("version"),
        resource=pc.take(pc.list_parent_indices(scope_lists), record_scope), resource_attributes=resource_attributes,
    )


def _wire_attributes(attributes: pa.ListArray, owners: Callable[[], list]) -> _Attributes:
    """The KeyValue lists of `attributes` (one per owner), their values' texts as value_text writes
    them; `owners()`: the owners' lists in `request`, for the values not read as columns."""
    pairs = attributes.flatten()
    offsets = attributes.offsets
    offsets = pc.subtract(offsets, offsets[0])

    def values() -> list:
        return [pair.value for pairs_of in owners() for pair in pairs_of]

    return _Attributes(offsets=offsets, keys=pairs.field("key"), texts=_wire_texts(pairs.field("value"), values, "null"))


def _wire_texts(values: pa.StructArray, in_request: Callable[[], list], empty: str | None) -> pa.Array:
    """Each AnyValue's text as value_text writes it (`empty` for one holding nothing: body_text's
    None, or an attribute's "null"). The scalar kinds as columns; any other (lists, objects, bytes,
    an index into a string table) and a double NaN or infinite (orjson writes null) from
    `in_request()`, the same AnyValues in order, one by one."""
    kinds = {kind.name: column for kind, column in zip(values.type, values.flatten())}  # (null where the AnyValue is)
    doubles = kinds["double_value"]
    finite = pc.is_finite(doubles)  # null where no double
    odd = pc.fill_null(pc.invert(finite), False)
    for name, column in kinds.items():
        if name not in _SCALARS and column.null_count < len(column):
            odd = pc.or_(odd, pc.is_valid(column))
    texts = [kinds["string_value"]]
    if kinds["int_value"].null_count < len(values):
        texts.append(pc.cast(kinds["int_value"], pa.string()))
    if finite.true_count:
        texts.append(_double_texts(pc.if_else(finite, doubles, pa.scalar(None, pa.float64()))))
    if kinds["bool_value"].null_count < len(values):
        texts.append(pc.if_else(kinds["bool_value"], "true", "false"))
    text = pc.coalesce(*texts) if len(texts) > 1 else texts[0]
    if odd.true_count:
        at = np.flatnonzero(odd.to_numpy(zero_copy_only=False))
        given = in_request()
        spelled = text.to_pylist()
        for place in at.tolist():
            spelled[place] = otel.value_text(given[place])
        text = pa.array(spelled, pa.string())
    return text.fill_null(empty) if empty is not None and text.null_count else text


def _hex(ids: pa.BinaryArray) -> pa.Array:
    """Each id's bytes as lower-case hex, as bytes.hex() writes them ("" for none), in two numpy gathers."""
    if ids.null_count:
        ids = ids.fill_null(b"")
    bounds = np.frombuffer(ids.buffers()[1], np.int32)[ids.offset:ids.offset + len(ids) + 1]
    data = np.frombuffer(ids.buffers()[2], np.uint8)[bounds[0]:bounds[-1]] if bounds[-1] > bounds[0] else np.empty(0, np.uint8)
    digits = np.empty(2 * len(data), np.uint8)
    digits[0::2], digits[1::2] = _HEX_DIGITS[data >> 4], _HEX_DIGITS[data & 15]
    return pa.StringArray.from_buffers(len(ids), pa.py_buffer((bounds - bounds[0]) * 2), pa.py_buffer(digits))


def _gather_attributes(pairs: Iterable, into: tuple[list, list, list]) -> None:
    offsets, keys, texts = into
    for pair in pairs:
        keys.append(pair.key)
        value = pair.value
        texts.append(value.string_value if value.WhichOneof("value") == "string_value" else otel.value_text(value))
    offsets.append(len(keys))


def _rows(records: _Records) -> pa.Table:
    """The records as the otel_logs table's rows (spark_jobs/otlp_rows.py): what otel.events makes
    of each, the maps in key order. _NotPlain for a key twice in one record's attributes (a dict
    keeps its first place and last value) or a key too long to be a field name (event_lines sets
    it aside)."""
    resource_attributes = _maps(records.resource_attributes).take(records.resource)
    return pa.Table.from_arrays([
        _timestamps(records.time), _timestamps(_null_if_zero(records.observed)), pc.cast(_null_if_zero(records.severity), pa.int32()),
        _null_if_empty(records.severity_text), records.body, _maps(records.attributes), resource_attributes,
        pc.take(_null_if_empty(records.scope_name), records.scope), pc.take(_null_if_empty(records.scope_version), records.scope),
        _null_if_empty(records.trace_id), _null_if_empty(records.span_id), pc.cast(_null_if_zero(records.flags), pa.int64()),
        _null_if_empty(records.event_name),
    ], schema=otlp_rows.ROWS)


def _timestamps(nanos: pa.Array) -> pa.Array:
    """UTC to the microsecond, as iso_from_unix_nanos reads them (the digits beyond cut off)."""
    micros = pc.cast(pc.divide(nanos, pa.scalar(1000, pa.uint64())), pa.int64())
    return pc.cast(micros, pa.timestamp("us", tz="UTC"))


def _or_else(nanos: pa.Array, otherwise: pa.Array | pa.Scalar) -> pa.Array:
    """`nanos` where it is not 0, else `otherwise`."""
    return pc.if_else(pc.not_equal(nanos, pa.scalar(0, pa.uint64())), nanos, otherwise)


def _null_if_zero(values: pa.Array) -> pa.Array:
    return _null_where(values, pc.equal(values, pa.scalar(0, values.type)))


def _null_if_empty(values: pa.Array) -> pa.Array:
    if values.null_count == len(values):
        return values
    return _null_where(values, pc.equal(values, ""))


def _null_where(values: pa.Array, where: pa.BooleanArray) -> pa.Array:
    """`values`, null where `where` is true. Most columns of an export are so everywhere or
    nowhere (no observed time, no event names): those cost no more compute calls (each costs
    ~10 microseconds whatever it holds: a call saved is worth more than the work it does)."""
    held = where.true_count
    if not held:
        return values
    if held == len(values):
        return pa.nulls(len(values), values.type)
    return pc.if_else(where, pa.scalar(None, values.type), values)


def _check_uint(values: pa.Array, bits: int) -> None:
    """otel._uint for a field read as an integer (a string there: pyarrow refused the export)."""
    if values.null_count == len(values):
        return
    values = values.drop_null() if values.null_count else values
    if not pc.all(pc.and_(pc.greater_equal(values, 0), pc.less(values, 1 << bits))).as_py():
        raise _NotPlain


def _uint(values: pa.Array, bits: int) -> pa.Array:
    """otel._uint of a field read as its string of digits: 0 where it is absent."""
    if values.null_count < len(values) and not _digits(values.drop_null()):
        raise _NotPlain
    numbers = pc.fill_null(pc.cast(values, pa.uint64()), 0)  # ArrowInvalid past 2**64 - 1
    if bits < 64:
        _check_uint(numbers, bits)
    return numbers


def _digits(texts: pa.Array, signed: bool = False) -> bool:
    """Whether each text is 1 to 20 decimal digits (otel._uint's), or (`signed`) those or a minus
    and 1 to 19 (otel._any_value_text's intValue). Three to five compute calls: a regular
    expression took five times their time (~85 against ~17 microseconds for 1,000 times)."""
    unsigned = texts
    if signed and (negative := pc.starts_with(texts, "-")).true_count:
        unsigned = pc.if_else(negative, pc.utf8_slice_codeunits(texts, 1), texts)
    return pc.all(pc.and_(pc.ascii_is_decimal(unsigned), pc.less_equal(pc.binary_length(texts), 20))).as_py()


def _hex_id(values: pa.Array) -> pa.Array:
    """otel._hex_id: an even count of hex digits, lower-cased; "" or null where absent."""
    values = _null_if_empty(values)
    if values.null_count == len(values):
        return values
    if not pc.all(pc.match_substring_regex(values, _HEX_ID)).as_py():  # (all skips nulls)
        raise _NotPlain
    return pc.utf8_lower(values)


def _value_texts(values: pa.StructArray, body: bytes, empty: str | None) -> pa.Array:
    """otel._any_value_text of each AnyValue read from `body`; `empty` for one holding nothing.
    _NotPlain for one holding two kinds, or a double that may be a JSON integer orjson reads as
    a float (past 64 bits: json_events would give its text otherwise)."""
    kinds = [values.field(name) for name in ("stringValue", "intValue", "doubleValue", "boolValue")]
    texts = [kinds[0]]
    if kinds[1].null_count < len(kinds[1]):
        if not _digits(kinds[1].drop_null(), signed=True):
            raise _NotPlain
        texts.append(pc.cast(pc.cast(kinds[1], pa.int64()), pa.string()))  # ArrowInvalid outside int64: str(int(...)) there
    if kinds[2].null_count < len(kinds[2]):
        if pc.max(pc.abs(kinds[2])).as_py() >= _LARGEST_SHORT and may_hold_long_integers(body) and _LONG_INTEGER.search(body):
            raise _NotPlain
        texts.append(_double_texts(kinds[2]))
    if kinds[3].null_count < len(kinds[3]):
        texts.append(pc.if_else(kinds[3], "true", "false"))
    text = pc.coalesce(*texts) if len(texts) > 1 else texts[0]
    # Each kind's text is null where the kind is: the values held, kind by kind, are as many as
    # the values holding any only if none holds two.
    if sum(len(kind) - kind.null_count for kind in kinds) != len(text) - text.null_count:
        raise _NotPlain
    return text.fill_null(empty) if empty is not None and text.null_count else text


def _double_texts(doubles: pa.Array) -> pa.Array:
    """Each double as orjson writes it (null stays null): orjson writes them all as one array, whose
    text is split at its commas. _NotPlain for NaN or an infinity, which orjson writes as null
    (value_text writes "null" for them; json_events never sees one, pyarrow reads them)."""
    if not pc.all(pc.is_finite(doubles.drop_null())).as_py():
        raise _NotPlain
    text = orjson.dumps(doubles.fill_null(0.0).to_numpy(zero_copy_only=False), option=orjson.OPT_SERIALIZE_NUMPY)
    texts = pc.split_pattern(pa.array([text[1:-1].decode()]), ",")[0].values
    return pc.if_else(pc.is_valid(doubles), texts, pa.scalar(None, pa.string()))


def _maps(attributes: _Attributes) -> pa.MapArray:
    """Each owner's attributes as the map otel._attributes makes of them, in key order.
    _NotPlain for a key too long to be a field name or a key twice in one list."""
    keys = attributes.keys
    if len(keys) and pc.max(pc.binary_length(keys)).as_py() > MAX_FIELD_NAME:
        raise _NotPlain
    maps = otlp_rows.key_ordered_maps(attributes.offsets, keys, attributes.texts)
    if maps is None:
        raise _NotPlain
    return maps
