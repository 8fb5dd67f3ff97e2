"""The short way for batches whose events fit their table as they are (spark_jobs/direct_append.py),
run here on its own (no Spark: the function a Spark task runs, given the task's Arrow batch). What
it writes must be what the Spark job writes; whatever the Spark job would treat otherwise than as
a plain row, it must refuse, leaving nothing behind."""

from __future__ import annotations

import io
import json
import uuid
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.json as pajson
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyarrow import fs as pafs
from pyiceberg.schema import Schema
from pyiceberg.transforms import BucketTransform, DayTransform
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
)

from spark_jobs.buckets import buckets, murmur3_32
from spark_jobs.columns import LINE_SLOTS
from spark_jobs.direct_append import (
    DROP_KEYS,
    DROP_VALUES,
    MANY_INFERRED,
    MAX_MISTYPED,
    BodyReader,
    FallbackMemory,
    Lines,
    Refused,
    Unspellable,
    _appender,
    _extras_by_column,
    _JsonLayout,
    _KeysBefore,
    _spans,
    _twice,
    exact_numbers,
    extra_maps,
    extra_text,
    java_double,
    json_event,
    key_colons,
    may_read_as_number,
    parse_schema,
    places,
    quoted_texts,
    tasks_for,
    write_partitioned,
)

TABLE = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "msg", StringType()),
    NestedField(3, "n", IntegerType()),
    NestedField(4, "x", DoubleType()),
    NestedField(5, "ok", BooleanType()),
    NestedField(6, "_extra", MapType(7, StringType(), 8, StringType())),
).as_arrow()


def answers(tmp_path, bodies: dict[str, bytes], schema: pa.Schema, extra_fields: str | None, partition: list[tuple[str, str]]) -> list[dict]:  # noqa: ANN001
    """What one Spark task of the short way answers for `bodies` (one row per file written)."""
    parsing = parse_schema(schema, "_extra" if "_extra" in schema.names else None, partition)
    append = _appender(str(tmp_path / "batch"), pafs.LocalFileSystem(), parsing, schema, frozenset({"id"}), extra_fields, partition)
    batch = pa.record_batch({
        "receipt": list(bodies), "body": pa.array(list(bodies.values()), pa.large_binary()),
        "seq": pa.array([index * LINE_SLOTS for index in range(len(bodies))], pa.int64()),
    })
    return [row for out in append(iter([batch])) for row in out.to_pylist()]


def run(tmp_path, bodies: dict[str, bytes], extra_fields: str | None = "_extra") -> dict:  # noqa: ANN001
    (answer,) = answers(tmp_path, bodies, TABLE, extra_fields, [])
    return answer


def test_events_that_fit_are_one_file_in_the_tables_schema_with_counts_per_receipt(tmp_path) -> None:  # noqa: ANN001
    answer = run(tmp_path, {
        "r1": b'{"id": 1, "msg": "a", "n": 3, "x": 2, "ok": true}\n{"id": 2, "msg": "b\\u00e9"}\n',
        "r2": b'{"id": 3, "x": 1.5}',
    })
    assert answer["refused"] is None and json.loads(answer["counts"]) == {"r1": 2, "r2": 1}
    written = pq.read_table(answer["path"])
    assert written.schema == TABLE  # names, types and nullability
    assert [f.metadata for f in written.schema] == [f.metadata for f in TABLE]  # and Iceberg's field ids
    assert written.to_pylist() == [
        {"id": 1, "msg": "a", "n": 3, "x": 2.0, "ok": True, "_extra": None},
        {"id": 2, "msg": "bé", "n": None, "x": None, "ok": None, "_extra": None},
        {"id": 3, "msg": None, "n": None, "x": 1.5, "ok": None, "_extra": None},
    ]


NOT_PLAIN = [
    b'{"id": 1, "level": 1e400}',        # a field the table lacks that Spark spells "Infinity"
    b'{"id": 1, "level": 1e17}',         # ... or, as Java 17 does, not always in the fewest digits
    b'{"id": 1, "level": ["a\\u0001"]}',  # ... or a control character in a list, which Jackson writes in capitals
    b'{"id": 1, "level": 1, "level": 2}',  # ... twice
    b'{"id": 1, "msg": 5}',              # a number for a string column (the Spark job's coercion rules decide)
    b'{"id": "1"}',                      # a string for a long column
    b'{"id": 1, "n": 3000000000}',       # out of an int column's range
    b'{"id": 1.5}',                      # a fraction for a long column
    b'{"id": 1, "msg": "a", "msg": "b"}',  # a duplicate key (the Spark job keeps the last)
    b'{"msg": "no id"}',                 # a required column missing (the DLQ)
    b'{"id": null}',                     # ... or null
    b'{"id": 1}\n{}',                    # an event with no field of the table
    b'[1, 2]',                           # not an object
]


@pytest.mark.parametrize("body", NOT_PLAIN)
def test_anything_but_a_plain_row_is_refused_and_nothing_is_left(tmp_path, body: bytes) -> None:  # noqa: ANN001
    answer = run(tmp_path, {"r1": b'{"id": 7, "msg": "fine"}', "r2": body})
    assert answer["refused"] and answer["path"] is None
    assert not list((tmp_path).rglob("*.parquet"))


@pytest.mark.parametrize("body", NOT_PLAIN)
def test_by_request_a_request_with_anything_but_plain_rows_is_left_out_and_the_others_written(tmp_path, body: bytes) -> None:  # noqa: ANN001
    parsing = parse_schema(TABLE, "_extra", [])
    append = _appender(str(tmp_path / "batch"), pafs.LocalFileSystem(), parsing, TABLE, frozenset({"id"}), "_extra", [], by_request=True)
    bodies = [b'{"id": 7, "msg": "fine"}', body, b'{"id": 8}\n{"id": 9, "n": 2}']
    batch = pa.record_batch({
        "receipt": ["r1", "r2", "r3"], "body": pa.array(bodies, pa.large_binary()),
        "seq": pa.array([index * LINE_SLOTS for index in range(3)], pa.int64()),
    })
    (answer,) = [row for out in append(iter([batch])) for row in out.to_pylist()]
    assert answer["refused"] is None and json.loads(answer["rejected"]) == [LINE_SLOTS], "the second request, by its place"
    assert json.loads(answer["counts"]) == {"r1": 1, "r3": 2}
    assert [row["id"] for row in pq.read_table(answer["path"]).to_pylist()] == [7, 8, 9]


@pytest.mark.parametrize("by_request", [True, False])
def test_a_fault_of_the_reader_on_one_request_leaves_that_request_to_the_spark_job_and_fails_no_task(
        tmp_path, monkeypatch, capfd, by_request: bool) -> None:  # noqa: ANN001
    """No input is known to reach a fault of the reader now (the last, the key's text found only as a
    value, is fixed: test_values_in_a_text_column_...): the fault is injected, as no real part can
    be made to produce one. By request, the others are written; all or nothing (row changes), the
    task refuses the batch. Neither fails the task, which would turn the short way off for all."""
    read_rows = BodyReader.read_rows

    def faulty(self, body: bytes) -> tuple[pa.Table, int]:  # noqa: ANN001
        if b"boom" in body:
            raise AttributeError("'NoneType' object has no attribute 'end'")
        return read_rows(self, body)

    monkeypatch.setattr(BodyReader, "read_rows", faulty)
    parsing = parse_schema(TABLE, "_extra", [])
    append = _appender(str(tmp_path / "batch"), pafs.LocalFileSystem(), parsing, TABLE, frozenset({"id"}), "_extra", [], by_request=by_request)
    bodies = [b'{"id": 7, "msg": "fine"}', b'{"id": 1, "msg": "boom"}', b'{"id": 8}']
    batch = pa.record_batch({
        "receipt": ["r1", "r2", "r3"], "body": pa.array(bodies, pa.large_binary()),
        "seq": pa.array([index * LINE_SLOTS for index in range(3)], pa.int64()),
    })
    (answer,) = [row for out in append(iter([batch])) for row in out.to_pylist()]
    if by_request:
        assert answer["refused"] is None and json.loads(answer["rejected"]) == [LINE_SLOTS]
        assert [row["id"] for row in pq.read_table(answer["path"]).to_pylist()] == [7, 8]
    else:
        assert answer["path"] is None and answer["refused"].startswith("the short way's reader failed on this request (AttributeError")
    assert "calve: the short way's reader failed on this request (AttributeError" in capfd.readouterr().err


def test_fields_the_table_lacks_go_into_the_extra_map_as_the_spark_job_spells_them(tmp_path) -> None:  # noqa: ANN001
    answer = run(tmp_path, {
        "r1": b'{"id": 1, "msg": "a", "level": "warn"}\n{"id": 2, "o": {"b": 1, "c" : [1, 2.0, "x\\n"]}, "e": 1e3, "z": null}',
        # A field of changing type (pyarrow cannot infer it as a column): every line is read for it.
        "r2": b'{"id": 3, "code": 1}\n{"id": 4, "code": "E1", "_extra": 5}\n{"id": 5}',
    })
    assert answer["refused"] is None and json.loads(answer["counts"]) == {"r1": 2, "r2": 3}
    assert [row["_extra"] for row in pq.read_table(answer["path"]).to_pylist()] == [
        [("level", "warn")], [("o", '{"b":1,"c":[1,2.0,"x\\n"]}'), ("e", "1000.0")], [("code", "1")], [("code", "E1"), ("_extra", "5")], None,
    ]


# Fields the table lacks, each name's values of one kind (as a logger sends them) but now and then
# null, a key's own text or an object; names plain and odd.
_PLAIN_TEXT = st.text(st.characters(codec="ascii", exclude_categories=("Cc",)), max_size=6)
_TEXTS = st.integers(0, 19).flatmap(lambda n: st.text(max_size=4) if n == 0 else st.sampled_from(["trace_id", "span_id", "x\\u"]) if n == 1
                                     else _PLAIN_TEXT)
EXTRA_FIELDS = {"trace_id": _TEXTS, "span_id": st.integers(0, 9).flatmap(lambda n: st.none() if n == 0 else _TEXTS), "user": st.integers(-(10**6), 10**6), "ok": st.booleans(),
                "a/b": _TEXTS, "é": _TEXTS, 'x"y': _TEXTS, "": _TEXTS, "id2": st.integers() | st.just({"trace_id": 1}), "cost": st.floats(-1e3, 1e3),
                # A number now whole, now a fraction, now beyond a long (pyarrow reads them all as doubles), of any size.
                "took": st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(10**20), 10**20) | st.floats(-1e8, 1e8).map(lambda x: round(x, 3)),
                # Objects and lists (a shipper's pod, a list of tags), copied as their text.
                "pod": st.fixed_dictionaries({"ns": _PLAIN_TEXT, "labels": st.fixed_dictionaries({}, optional={"app": _TEXTS, "tier": _PLAIN_TEXT})},
                                             optional={"n": st.integers(-(10**20), 10**20), "ports": st.lists(st.integers(-3, 3), max_size=3),
                                                       "w": st.floats(-1e3, 1e3), "on": st.booleans() | st.none(), "s": st.text(max_size=3)}),
                "tags": st.lists(_PLAIN_TEXT, max_size=3)}
PLAIN_EXTRA_NAMES = ["trace_id", "span_id", "user", "ok", "took"]


@st.composite
def events_with_extras(draw) -> list[dict]:  # noqa: ANN001
    """Events with fields the table lacks, mostly in one order (a logger's), now and then in another."""
    odd = draw(st.lists(st.sampled_from(sorted(set(EXTRA_FIELDS) - set(PLAIN_EXTRA_NAMES))), max_size=1)) if draw(st.booleans()) else []
    names = draw(st.permutations(PLAIN_EXTRA_NAMES + odd))
    events = []
    for index in range(draw(st.integers(1, 6))):
        held = [name for name in names if draw(st.integers(0, 3))]
        if draw(st.integers(0, 9)) == 0:
            held = draw(st.permutations(held))
        events.append({"id": index, **{name: draw(EXTRA_FIELDS[name]) for name in dict.fromkeys(held)}})
    return events


@settings(max_examples=300, deadline=None)
@given(events_with_extras(), st.integers(0, 4).map(lambda n: n == 0))
def test_the_extra_maps_taken_from_the_inferred_columns_are_those_read_from_the_lines(events: list, ascii_only: bool) -> None:
    """Whichever way extra_maps takes (the columns pyarrow inferred for the fields, where it is
    sure; else each line read again, as every_line does), the maps are the same: keys in each
    event's order, values spelled alike."""
    lines = [json.dumps(event, ensure_ascii=ascii_only).encode() for event in events]
    body = b"\n".join(lines)
    parsing = parse_schema(TABLE, "_extra", [])
    try:
        table = pajson.read_json(io.BytesIO(body), parse_options=pajson.ParseOptions(explicit_schema=parsing, unexpected_field_behavior="infer"))
    except pa.ArrowInvalid:
        return  # a field of changing type: not inferred as a column, every line is read (read_fields)
    try:
        expected = extra_maps(table, lines, parsing.names, every_line=True).to_pylist()
    except ValueError:
        expected = "unspellable"
    try:
        assert extra_maps(table, lines, parsing.names, body=body).to_pylist() == expected
    except ValueError:
        assert expected == "unspellable"


def test_the_extra_maps_of_traced_events_come_from_the_inferred_columns_where_each_key_is_found_once() -> None:
    def columns(body: bytes) -> list:
        table = pajson.read_json(io.BytesIO(body), parse_options=pajson.ParseOptions(
            explicit_schema=parse_schema(TABLE, "_extra", []), unexpected_field_behavior="infer"))
        return [(name, table.column(name)) for name in ("trace_id", "span_id", "retry") if name in table.column_names]

    traced = b'{"id": 1, "trace_id": "t1", "span_id": "s1"}\n{"id": 2, "retry": 3}\n{"id": 3, "trace_id": "t3", "retry": true}'
    with pytest.raises(pa.ArrowInvalid):
        columns(traced)  # retry: an integer, then a boolean
    traced = traced.replace(b"true", b"4")
    assert _extras_by_column(columns(traced), traced).to_pylist() == [
        [("trace_id", "t1"), ("span_id", "s1")], [("retry", "3")], [("trace_id", "t3"), ("retry", "4")],
    ]
    reordered = traced + b'\n{"id": 4, "span_id": "s4", "trace_id": "t4"}'  # each map in its event's order
    assert _extras_by_column(columns(reordered), reordered).to_pylist()[2:] == [[("trace_id", "t3"), ("retry", "4")], [("span_id", "s4"), ("trace_id", "t4")]]
    for other in (b'{"id": 4, "trace_id": "t4", "span_id": "s4", "msg": "trace_id"}',  # a key's text as a value
                  b'{"id": 4, "trace_id": "t4", "span_\\u0069d": "s4"}',  # a key spelled with an escape
                  b'{"id": 4, "trace_id": "t4", "span_id": null, "retry": 1}'):  # a null's key
        body = traced + b"\n" + other
        assert _extras_by_column(columns(body), body) is None, other


def test_the_extra_maps_of_objects_and_lists_are_the_text_of_each_value_without_the_spaces_between_tokens() -> None:
    """A Kubernetes shipper's pod (an object with a map of labels in it) and a list, in events
    written with spaces (Python's json) and with escapes Jackson writes alike: each value's text
    is copied from the body, as reading every line makes it; where a copy is not sure to be the
    value's text (a fraction Java spells otherwise, -0, a \\/ escape, a character beyond the Basic
    Multilingual Plane) that value's line is read again, and where most are, every line (None)."""
    lines = [
        b'{"id": 1, "pod": {"ns": "prod", "name": "web-7d9f", "labels": {"app": "web", "tier": "a \\"b\\" \\\\ \\n [}"}}, "tags": ["x", "y"]}',
        b'{"id": 2, "tags": [], "pod" : { "ns" : "dev" , "name": "db-1", "labels": {}, "n": 123456789012345678901, "on": null }}',
        b'{"id": 3, "msg": "no pod here", "pod": {"ns": "\xc3\xa9t\xc3\xa9", "name": "x{", "labels": {"app": "]"}, "ok": [true, false]}}',
        b'{"id": 4}',
        # Fractions Java spells as they are written, and whole doubles (5.0: Java's spelling too).
        b'{"id": 5, "tags": [], "pod": {"ns": "a", "took": [0.123, -12345.5, 5.0, 0.001, 9999999.75, -0.5]}}',
    ]
    body = b"\n".join(lines)
    parsing = parse_schema(TABLE, "_extra", [])
    table = pajson.read_json(io.BytesIO(body), parse_options=pajson.ParseOptions(explicit_schema=parsing, unexpected_field_behavior="infer"))
    assert pa.types.is_struct(table.schema.field("pod").type) and pa.types.is_list(table.schema.field("tags").type)
    expected = extra_maps(table, lines, parsing.names, every_line=True).to_pylist()
    assert expected[0] == [("pod", '{"ns":"prod","name":"web-7d9f","labels":{"app":"web","tier":"a \\"b\\" \\\\ \\n [}"}}'), ("tags", '["x","y"]')]
    assert expected[3] is None
    held = [(name, table.column(name)) for name in ("pod", "tags")]
    assert _extras_by_column(held, body).to_pylist() == expected
    for unsure in (b'{"id": 5, "pod": {"ns": "a", "w": 1.50}}', b'{"id": 5, "pod": {"ns": "a", "w": 1e3}}', b'{"id": 5, "pod": {"ns": "a", "w": 1e7}}',
                   b'{"id": 5, "pod": {"ns": "a", "w": 0.0001}}', b'{"id": 5, "pod": {"ns": "a", "w": 10000000.5}}', b'{"id": 5, "pod": {"ns": "a", "n": -0}}',
                   b'{"id": 5, "pod": {"ns": "\xf0\x9f\x98\x80"}}', b'{"id": 5, "pod": {"ns": "a\\/b"}}'):
        other = body + b"\n" + unsure
        lines_too = [*lines, unsure]
        table = pajson.read_json(io.BytesIO(other), parse_options=pajson.ParseOptions(explicit_schema=parsing, unexpected_field_behavior="infer"))
        held = [(name, table.column(name)) for name in ("pod", "tags")]
        assert _extras_by_column(held, other).to_pylist() == extra_maps(table, lines_too, parsing.names, every_line=True).to_pylist(), unsure
        # Most values so: every line is read again (None here).
        other = b"\n".join([other, *[unsure.replace(b'"id": 5', b'"id": %d' % n) for n in range(6, 9)]])
        table = pajson.read_json(io.BytesIO(other), parse_options=pajson.ParseOptions(explicit_schema=parsing, unexpected_field_behavior="infer"))
        assert _extras_by_column([(name, table.column(name)) for name in ("pod", "tags")], other) is None, unsure
    # A \\u escape anywhere in the body: a key may be spelled with one, so where each is is not sure.
    other = body + b'\n{"id": 5, "pod": {"ns": "\\u00e9"}}'
    table = pajson.read_json(io.BytesIO(other), parse_options=pajson.ParseOptions(explicit_schema=parsing, unexpected_field_behavior="infer"))
    assert _extras_by_column([(name, table.column(name)) for name in ("pod", "tags")], other) is None


def test_an_object_is_copied_from_its_events_own_field_wherever_else_its_name_is_spelled() -> None:
    """An object the table lacks is copied from each event's own top-level field (msgspec's text
    of it), not from where its name is found in the body: its key spelled with an escape, a null
    of it in another event, its name as a value or as a key inside it, a blank line among the
    events. Each map is the one reading every line makes (finding the key in the body could not
    be sure of any of these, and left the whole body to that reading)."""
    lines = [b'{"id": 1, "pod": {"ns": "prod", "pod": "web-1", "labels": {"app": "pod"}}}',
             b'{"id": 2, "p\\u006fd": {"ns": "dev"}, "msg": "the pod"}',
             b'{"id": 3, "pod": null}',
             b'{"id": 4}',
             b'{"id": 5, "pod": {"ns": "\\u00e9t\\u00e9", "took": 1.50}}',  # (read again: Jackson spells both otherwise)
             b'{"id": 6, "pod": {"ns": "prod"}}', b'{"id": 7, "pod": {"ns": "prod"}}']
    body = b"\n".join(lines[:3]) + b"\n\n" + b"\n".join(lines[3:])
    parsing = parse_schema(TABLE, "_extra", [])
    table = pajson.read_json(io.BytesIO(body), parse_options=pajson.ParseOptions(explicit_schema=parsing, unexpected_field_behavior="infer"))
    expected = extra_maps(table, lines, parsing.names, every_line=True).to_pylist()
    assert expected == [[("pod", '{"ns":"prod","pod":"web-1","labels":{"app":"pod"}}')], [("pod", '{"ns":"dev"}')], None, None,
                        [("pod", '{"ns":"\u00e9t\u00e9","took":1.5}')], [("pod", '{"ns":"prod"}')], [("pod", '{"ns":"prod"}')]]
    copied = _extras_by_column([("pod", table.column("pod"))], body)
    assert copied is not None and copied.to_pylist() == expected


# Objects and lists whose copy is sure to be their text: ASCII strings (quotes, backslashes and
# brackets in them, escaped by json.dumps as Jackson escapes them; no "p" or "t", so no value spells
# a field's name), integers of any size, doubles from 1e-3 to 1e7, booleans and nulls, nested. Keys keep their types, so pyarrow
# infers a column.
_SURE_TEXT = st.text(st.sampled_from('abc xyz"\\{}[]:,'), max_size=5)
_SURE_POD = st.fixed_dictionaries(
    {"ns": _SURE_TEXT, "labels": st.dictionaries(st.sampled_from(["app", "tier", "x y"]), _SURE_TEXT, max_size=3), "n": st.integers(-(10**20), 10**20)},
    optional={"ports": st.lists(st.integers(-3, 3), max_size=3), "on": st.booleans() | st.none(),
              # Doubles where Java's Double.toString writes them as Python's repr does.
              "took": st.floats(1e-3, 1e7, exclude_max=True) | st.floats(-1e7, -1e-3, exclude_min=True),
              "sub": st.fixed_dictionaries({"a": st.lists(_SURE_TEXT, max_size=2)})})


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.none() | _SURE_POD, st.none() | st.lists(_SURE_TEXT, max_size=3), st.booleans()), min_size=1, max_size=6),
       st.sampled_from([(", ", ": "), (",", ":"), (" , ", " :  ")]))
def test_the_extra_maps_of_objects_and_lists_are_copied_from_the_body_as_reading_each_line_makes_them(
        events: list, separators: tuple[str, str]) -> None:
    """Events with an object and a list the table lacks (each now absent), written compact or with
    spaces, and the two fields in either order: copied from the body (never left to reading every
    line, here where each copy is sure), the maps are those reading every line makes."""
    lines = []
    for index, (pod, tags, tags_first) in enumerate(events):
        fields = {"pod": pod, "tags": tags} if not tags_first else {"tags": tags, "pod": pod}
        event = {"id": index, **{name: value for name, value in fields.items() if value is not None}}
        lines.append(json.dumps(event, separators=separators).encode())
    body = b"\n".join(lines)
    parsing = parse_schema(TABLE, "_extra", [])
    table = pajson.read_json(io.BytesIO(body), parse_options=pajson.ParseOptions(explicit_schema=parsing, unexpected_field_behavior="infer"))
    held = [(name, table.column(name)) for name in ("pod", "tags") if name in table.column_names]
    if not held:
        return
    expected = extra_maps(table, lines, parsing.names, every_line=True).to_pylist()
    assert _extras_by_column(held, body).to_pylist() == expected


# Any JSON value, for fields whose type changes from event to event (pyarrow cannot infer them).
_ANY_TEXT = st.text(max_size=4) | st.sampled_from(["", "a b", 'q"\\', "x\ny", "é", "😀", "trace_id", "x\\u"])
_ANY_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**20), 10**20) | st.floats(allow_nan=False, allow_infinity=False) | st.floats(-1e4, 1e4) | _ANY_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_ANY_TEXT, inner, max_size=3), max_leaves=5)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(["user", "code", "a b", "é", "msg", "id2", "ok"]), _ANY_VALUE, max_size=4), min_size=1, max_size=6),
       st.booleans(), st.sampled_from([(", ", ": "), (",", ":")]))
def test_the_extra_maps_of_fields_of_changing_type_are_read_from_where_the_keys_and_values_are_as_from_each_line(
        fields: list[dict], ascii_only: bool, separators: tuple[str, str]) -> None:
    """Fields the table lacks whose type changes from event to event (a user id now a number, now
    text), which pyarrow cannot infer: their maps taken from where the body's keys and values are
    (_JsonLayout.unknown_fields, each value's text copied, or its line read again where that is
    not sure) are those reading every line makes, or both refuse."""
    lines = [json.dumps({"id": index, **event}, ensure_ascii=ascii_only, separators=separators).encode() for index, event in enumerate(fields)]
    body = b"\n".join(lines)
    parsing = parse_schema(TABLE, "_extra", [])
    try:
        table = pajson.read_json(io.BytesIO(body), parse_options=pajson.ParseOptions(explicit_schema=parsing, unexpected_field_behavior="ignore"))
    except pa.ArrowInvalid:
        return  # a table's own field of another type: not this reading's to say
    try:
        expected = extra_maps(table, lines, parsing.names, every_line=True).to_pylist()
    except ValueError:
        expected = "unspellable"
    try:
        got = extra_maps(table, lines, parsing.names, every_line=True, body=body).to_pylist()
    except ValueError:
        got = "unspellable"
    assert got == expected


def test_fields_of_changing_type_are_read_from_the_layout_without_reading_each_line_again() -> None:
    """A user id now a number, now text, beside a fraction, an object and a list (the table's own
    `ok` and `msg` not in the maps, a null none): the maps come from the layout (not None), as
    reading every line makes them, the two values whose copy is not sure (an escape, an exponent)
    read again from their lines; a key twice in an event, or a key that is no UTF-8, is left to
    that reading (None), which refuses it."""
    lines = [b'{"id": 1, "user": 12345, "ok": true, "took": 0.25, "msg": "a"}', b'{"id": 2, "user": "anon", "pod": {"ns": "x"}, "gone": null}',
             b'{"user": -7, "id": 3}', b'{"id": 4}', b'{"id": 5, "user": "a \\"quoted\\" one", "took": 1e3}',
             b'{"id": 6, "user": 9}', b'{"id": 7, "user": "bob"}', b'{"id": 8, "code": [1, "2"]}']
    body = b"\n".join(lines)
    parsing = parse_schema(TABLE, "_extra", [])
    table = pajson.read_json(io.BytesIO(body), parse_options=pajson.ParseOptions(explicit_schema=parsing, unexpected_field_behavior="ignore"))
    maps = _JsonLayout(body).unknown_fields(parsing.names, len(lines))
    assert maps is not None
    assert maps.to_pylist() == extra_maps(table, lines, parsing.names, every_line=True).to_pylist() == [
        [("user", "12345"), ("took", "0.25")], [("user", "anon"), ("pod", '{"ns":"x"}')], [("user", "-7")], None,
        [("user", 'a "quoted" one'), ("took", "1000.0")], [("user", "9")], [("user", "bob")], [("code", '[1,"2"]')],
    ]
    twice = body + b'\n{"id": 6, "user": 1, "user": 2}'
    assert _JsonLayout(twice).unknown_fields(parsing.names, len(lines) + 1) is None
    not_utf8 = body + b'\n{"id": 6, "us\xffer": 1}'
    assert _JsonLayout(not_utf8).unknown_fields(parsing.names, len(lines) + 1) is None


@given(st.lists(st.integers(0, 40), max_size=60), st.sampled_from([41, 10**7]))
def test_a_value_there_twice_is_found_whether_counted_or_sorted(pairs: list[int], kinds: int) -> None:
    """_twice (a key twice in an event, as each event's keys' codes): counted where the kinds are
    few, sorted where they are many, the same answer as a set's."""
    assert _twice(np.array(pairs, np.int64), kinds) == (len(set(pairs)) < len(pairs))


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), max_size=12), st.binary(min_size=40, max_size=40))
def test_spans_in_ascending_order_are_their_bytes(steps: list[tuple[int, int]], text: bytes) -> None:
    """_spans of spans in ascending order and apart (empty ones, and ones that touch, too), as
    _pieces copies them: each its bytes, or None where one is no UTF-8."""
    starts, ends, at = [], [], 0
    for gap, length in steps:
        if at + gap + length > len(text):
            break
        starts.append(at + gap)
        ends.append(at + gap + length)
        at += gap + length
    got = _spans(np.frombuffer(text, np.uint8), np.array(starts, np.int64), np.array(ends, np.int64))
    try:
        expected = [text[start:end].decode() for start, end in zip(starts, ends)]
    except UnicodeDecodeError:
        expected = None
    assert (None if got is None else got.to_pylist()) == expected


@given(st.lists(st.sampled_from([b'{"a":1}', b'{"b":"x"}', b"", b" ", b"\r", b"\t", b" {}", b"\x0b", b"{\r"]), max_size=8),
       st.sampled_from([b"\n", b"\r\n"]), st.booleans())
def test_a_body_counts_and_gives_its_non_blank_lines_as_splitting_it_does(pieces: list[bytes], newline: bytes, last: bool) -> None:
    """Lines counts a body's events without splitting it where it can (every line a brace's),
    and otherwise splits it: always as many, and the same lines, as `line.strip()` keeps."""
    body = newline.join(pieces) + (newline if last else b"")
    split = [line for line in body.split(b"\n") if line.strip()]
    assert len(Lines(body)) == len(split)
    assert list(Lines(body)) == split and [Lines(body)[i] for i in range(len(split))] == split


def test_a_body_whose_layout_is_given_up_on_sends_the_next_few_straight_to_reading_every_line() -> None:
    """A producer's bodies whose every unknown field holds an exponent (most values not sure):
    the first body tries the layout and gives up, so the task's next FallbackMemory.SKIPPED bodies
    are read line by line without trying (the memory counts them down), and then it is tried
    again; the maps are the same either way. A body the layout reads leaves the memory alone."""
    lines = [b'{"id": %d, "user": %s, "score": %de-9}' % (i, b'"u%d"' % i if i % 2 else b"%d" % i, i) for i in range(1, 9)]
    body = b"\n".join(lines)
    parsing = parse_schema(TABLE, "_extra", [])
    table = pajson.read_json(io.BytesIO(body), parse_options=pajson.ParseOptions(explicit_schema=parsing, unexpected_field_behavior="ignore"))
    alone = extra_maps(table, lines, parsing.names, every_line=True).to_pylist()
    memory = FallbackMemory()
    assert extra_maps(table, lines, parsing.names, True, body, memory).to_pylist() == alone
    assert memory.skips == FallbackMemory.SKIPPED
    for left in range(FallbackMemory.SKIPPED - 1, -1, -1):
        assert extra_maps(table, lines, parsing.names, True, body, memory).to_pylist() == alone
        assert memory.skips == left
    assert extra_maps(table, lines, parsing.names, True, body, memory).to_pylist() == alone  # tried again, given up again
    assert memory.skips == FallbackMemory.SKIPPED
    sure = b"\n".join(line.replace(b"e-9", b"") for line in lines)
    fresh = FallbackMemory()
    extra_maps(table, sure.split(b"\n"), parsing.names, True, sure, fresh)
    assert fresh.skips == 0


def test_the_extra_maps_of_numbers_read_as_doubles_are_spelled_as_each_event_wrote_its_number() -> None:
    """A field pyarrow reads as doubles holds whole numbers written as integers (kept as their
    digits) and as doubles (Java's spelling), fractions in and out of Double.toString's positional
    range: taken from the column, each map is the one read from its line."""
    numbers = [b"1.50", b"1E3", b"-0", b"5", b"5.0", b"0.0001", b"12345678.5", b"123456789012345678901234", b"-2.5e-3", b"0.1", b"1e-3", b"9999999.5"]
    lines = [b'{"id": %d, "took" :  %s, "up": true}' % (index, number) for index, number in enumerate(numbers)]
    body = b"\n".join(lines)
    parsing = parse_schema(TABLE, "_extra", [])
    table = pajson.read_json(io.BytesIO(body), parse_options=pajson.ParseOptions(explicit_schema=parsing, unexpected_field_behavior="infer"))
    assert table.schema.field("took").type == pa.float64()
    expected = extra_maps(table, lines, parsing.names, every_line=True).to_pylist()
    assert [dict(pairs)["took"] for pairs in expected] == [
        "1.5", "1000.0", "0", "5", "5.0", "1.0E-4", "1.23456785E7", "123456789012345678901234", "-0.0025", "0.1", "0.001", "9999999.5",
    ]
    held = [(name, table.column(name)) for name in ("took", "up")]
    assert _extras_by_column(held, body).to_pylist() == expected
    # The key's text once more (in a value): where each whole number was written is not sure.
    other = body + b'\n{"id": 99, "msg": "took"}'
    table = pajson.read_json(io.BytesIO(other), parse_options=pajson.ParseOptions(explicit_schema=parsing, unexpected_field_behavior="infer"))
    assert _extras_by_column([(name, table.column(name)) for name in ("took", "up")], other) is None


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=60).map(lambda data: bytes(b"ab\"_"[byte % 4] for byte in data)),
       st.binary(min_size=2, max_size=5).map(lambda text: bytes(b"ab\"_"[byte % 4] for byte in text)))
def test_places_finds_a_text_wherever_bytes_find_does_overlapping_ones_too(data: bytes, text: bytes) -> None:
    """places (numpy's search for a key in a body) against bytes.find from each place found plus
    one, on bodies of four letters, so that texts recur, overlap and sit at either end."""
    expected, place = [], -1
    while (place := data.find(text, place + 1)) >= 0:
        expected.append(place)
    assert places(np.frombuffer(data, np.uint8), text).tolist() == expected


def test_without_an_extra_fields_column_a_field_the_table_lacks_refuses_the_batch(tmp_path) -> None:  # noqa: ANN001
    answer = run(tmp_path, {"r1": b'{"id": 1, "level": "x"}'}, extra_fields=None)
    assert answer["refused"] and not list(tmp_path.rglob("*.parquet"))


@pytest.mark.parametrize(("text", "spelled"), [
    ('"plain é"', "plain é"), ("true", "true"), ("-0", "0"), ("12345678901234567890123", "12345678901234567890123"),
    ("1.50", "1.5"), ("1e3", "1000.0"), ("1E-7", "1.0E-7"), ("0.001", "0.001"), ("1e7", "1.0E7"), ("-0.0", "-0.0"),
    ('"😀"', "😀"), ('["😀 \\ud800\\udc00"]', '["\\uD83D\\uDE00 \\uD800\\uDC00"]'), ("123456789.125", "1.23456789125E8"), ("9999999.5", "9999999.5"), ('[ "x" , null, {} ]', '["x",null,{}]'),
    ('{"k": {"a":"q\\"\\\\\\t/"}, "k": 1}', '{"k":{"a":"q\\"\\\\\\t/"},"k":1}'),
])
def test_values_are_spelled_as_sparks_json_functions_spell_them(text: str, spelled: str) -> None:
    assert extra_text(json.loads(text, object_pairs_hook=tuple)) == spelled


def test_java_doubles_beyond_the_certain_range_are_unspellable() -> None:
    assert java_double(9.5e15) == "9.5E15"
    assert java_double(2.0**-10) == "9.765625E-4"
    # Java 17 prints 2**-24 as 5.9604644775390625E-8, not in its fewest digits (a random test found it).
    for value in (1e16, -2e23, float("inf"), 5e-324, -5e-323, 2.0**-24, 2.0**-700):  # Java: 4.9E-324, -4.9E-323
        with pytest.raises(Unspellable):
            java_double(value)


def test_a_job_gets_a_task_per_task_bytes_of_bodies_at_least_one_at_most_one_per_body() -> None:
    assert tasks_for([b"x" * 100] * 5, 1000) == 1
    assert tasks_for([b"x" * 100] * 5, 200) == 3  # 500 bytes: two tasks of 200 and one of the rest
    assert tasks_for([b"x" * 1000] * 3, 10) == 3
    assert tasks_for([b""], 10) == 1


def test_only_tables_of_columns_and_partitions_it_reads_take_the_short_way() -> None:
    assert parse_schema(TABLE, "_extra").names == ["id", "msg", "n", "x", "ok"]
    assert parse_schema(TABLE, None).names == ["id", "msg", "n", "x", "ok"]  # a map of strings: read after the parse (text_maps)
    with_int_map = Schema(NestedField(1, "id", LongType()), NestedField(2, "m", MapType(3, StringType(), 4, LongType()))).as_arrow()
    assert parse_schema(with_int_map, None) is None  # a map of numbers: the Spark job's conversion
    assert [parse_schema(TIMED, None, [("ts", "day")]).field(name).type for name in ("ts", "local", "d")] == [pa.string()] * 3  # time as text
    assert parse_schema(TIMED, None, [("msg", "truncate[2]"), ("d", "month"), ("id", "identity")]) is not None
    assert parse_schema(TIMED, None, [("id", "bucket[4]"), ("msg", "bucket[2]"), ("ts", "bucket[3]"), ("id", "truncate[10]")]) is not None
    assert parse_schema(TIMED, None, [("d", "hour")]) is None
    assert parse_schema(TIMED, None, [("ts", "truncate[10]")]) is None
    with_decimal = Schema(NestedField(1, "id", LongType()), NestedField(2, "amount", DecimalType(10, 2)), NestedField(3, "blob", BinaryType())).as_arrow()
    assert parse_schema(with_decimal, None).types == [pa.int64(), pa.decimal128(10, 2), pa.string()]  # binary as its base64 text
    assert parse_schema(with_decimal, None, [("amount", "bucket[4]")]) is None  # the Spark job has no bucket of a decimal
    # Wider decimals too: the Spark job reads a JSON number's digits, not a double's (coerce.coerce's exact).
    assert parse_schema(Schema(NestedField(1, "id", LongType()), NestedField(2, "big", DecimalType(38, 10))).as_arrow(), None).types == [
        pa.int64(), pa.decimal128(38, 10)]
    # A struct's decimals too (the Spark job reads their digits: coerce.exact_type), not a list's (it reads those through a double).
    decimal_inside = Schema(NestedField(1, "id", LongType()), NestedField(2, "s", StructType(NestedField(3, "a", DecimalType(30, 2))))).as_arrow()
    assert parse_schema(decimal_inside, None).field("s").type == pa.struct([("a", pa.decimal128(30, 2))])
    decimals_listed = Schema(NestedField(1, "id", LongType()), NestedField(2, "l", ListType(3, DecimalType(10, 2), element_required=False))).as_arrow()
    assert parse_schema(decimals_listed, None) is None
    nested = Schema(
        NestedField(1, "id", LongType()), NestedField(2, "tags", ListType(3, StringType(), element_required=False)),
        NestedField(4, "user", StructType(NestedField(5, "name", StringType()), NestedField(6, "nums", ListType(7, LongType(), element_required=False)))),
    ).as_arrow()
    assert parse_schema(nested, None).field("user").type == pa.struct([("name", pa.large_string()), ("nums", pa.list_(pa.int64()))])  # no field ids
    required_element = Schema(NestedField(1, "id", LongType()), NestedField(2, "tags", ListType(3, StringType(), element_required=True))).as_arrow()
    assert parse_schema(required_element, None) is None  # a null there: the Spark job says what it becomes
    timed_inside = Schema(NestedField(1, "id", LongType()), NestedField(2, "at", ListType(3, TimestamptzType(), element_required=False))).as_arrow()
    assert parse_schema(timed_inside, None) is None


TIMED_ICEBERG = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "ts", TimestamptzType()),
    NestedField(3, "local", TimestampType()),
    NestedField(4, "d", DateType()),
    NestedField(5, "msg", StringType()),
)
TIMED = TIMED_ICEBERG.as_arrow()


def run_timed(tmp_path, bodies: dict[str, bytes], partition: list[tuple[str, str]]) -> list[dict]:  # noqa: ANN001
    return answers(tmp_path, bodies, TIMED, None, partition)


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=timezone.utc)


def test_timestamps_and_dates_as_iso_8601_or_epoch_numbers_one_file_per_partition_value(tmp_path) -> None:  # noqa: ANN001
    answers = run_timed(tmp_path, {
        "iso": b'{"id": 1, "ts": "2024-05-01T23:30:00+05:30", "local": "2024-05-01 10:11:12.5", "d": "2024-05-01"}\n'
               b'{"id": 2, "ts": "2024-05-02 01:02:03.123456Z", "local": "2024-05-02"}\n{"id": 3, "ts": "2024-05-01", "msg": "x"}',
        "epoch": b'{"id": 4, "ts": 1714608000000, "local": -1, "d": 19844}\n{"id": 5, "ts": null}',
    }, [("ts", "day")])
    assert all(answer["refused"] is None for answer in answers)
    assert json.loads(answers[-1]["counts"]) == {"iso": 3, "epoch": 2}
    files = [pq.read_table(answer["path"]) for answer in answers]
    assert all(f.schema == TIMED for f in files)
    rows = {row["id"]: row for f in files for row in f.to_pylist()}
    assert rows[1] == {"id": 1, "ts": utc(2024, 5, 1, 18), "local": datetime(2024, 5, 1, 10, 11, 12, 500000), "d": date(2024, 5, 1), "msg": None}
    assert (rows[2]["ts"], rows[2]["local"]) == (utc(2024, 5, 2, 1, 2, 3, 123456), datetime(2024, 5, 2))
    assert rows[3]["ts"] == utc(2024, 5, 1)
    assert rows[4] == {"id": 4, "ts": utc(2024, 5, 2), "local": datetime(1969, 12, 31, 23, 59, 59, 999000), "d": date(2024, 5, 1), "msg": None}
    # One file per day (the partition value), the rows without a time in a file of their own.
    assert sorted(sorted(row["id"] for row in f.to_pylist()) for f in files) == [[1, 3], [2, 4], [5]]


def test_times_all_in_utc_read_as_the_same_times_among_others(tmp_path) -> None:  # noqa: ANN001
    """A body whose times all end in Z (most shippers') is cast at once; its rows are those the
    way for mixed offsets gives the same times (each line of it read with one other line)."""
    lines = [b'{"id": 1, "ts": "2024-05-01T23:30:00Z"}', b'{"id": 2, "ts": "2024-05-02 01:02:03.123456Z"}',
             b'{"id": 3, "ts": null}', b'{"id": 4, "ts": "1999-12-31T23:59:59.5Z"}', b'{"id": 5, "ts": "2024-05-01T10:11:12.123456789Z"}']
    mixed = b'{"id": 9, "ts": "2024-05-01T10:00:00+02:00"}'
    rows = {}
    for name, body in {"utc": b"\n".join(lines), **{f"mixed{n}": line + b"\n" + mixed for n, line in enumerate(lines)}}.items():
        answers = run_timed(tmp_path / name, {name: body}, [])
        assert all(answer["refused"] is None for answer in answers)
        rows[name] = {row["id"]: row["ts"] for answer in answers for row in pq.read_table(answer["path"]).to_pylist()}
    assert rows["utc"] == {key: value for n in range(len(lines)) for key, value in rows[f"mixed{n}"].items() if key != 9}
    assert rows["utc"][1] == utc(2024, 5, 1, 23, 30) and rows["utc"][3] is None and rows["utc"][5] == utc(2024, 5, 1, 10, 11, 12, 123456)


def test_digits_past_microseconds_are_dropped_as_sparks_cast_drops_them(tmp_path) -> None:  # noqa: ANN001
    """Nanoseconds (Go's RFC 3339, Docker's logs): the digits past the sixth are dropped, not
    rounded, before 1970 too (Spark 4's cast, seen: .999999999 is .999999 in 1950)."""
    answers = run_timed(tmp_path, {
        "r": b'{"id": 1, "ts": "2024-05-01T10:11:12.123456789Z", "local": "2024-05-01 10:11:12.9999999"}\n'
             b'{"id": 2, "ts": "1950-06-01T00:00:00.999999999+02:00", "local": "2024-05-01T10:11:12.5"}\n'
             b'{"id": 3, "ts": "2024-05-01T10:11:12.1234567-08:00"}\n{"id": 4, "ts": "2024-05-01 10:11:12"}',
    }, [("ts", "day")])
    assert all(answer["refused"] is None for answer in answers) and json.loads(answers[-1]["counts"]) == {"r": 4}
    rows = {row["id"]: row for answer in answers for row in pq.read_table(answer["path"]).to_pylist()}
    assert (rows[1]["ts"], rows[1]["local"]) == (utc(2024, 5, 1, 10, 11, 12, 123456), datetime(2024, 5, 1, 10, 11, 12, 999999))
    assert (rows[2]["ts"], rows[2]["local"]) == (utc(1950, 5, 31, 22, 0, 0, 999999), datetime(2024, 5, 1, 10, 11, 12, 500000))
    assert (rows[3]["ts"], rows[4]["ts"]) == (utc(2024, 5, 1, 18, 11, 12, 123456), utc(2024, 5, 1, 10, 11, 12))


@pytest.mark.parametrize("body", [
    b'{"id": 1, "ts": "2024-02-30T00:00:00Z"}',           # no such day (the Spark job's NULL)
    b'{"id": 1, "ts": "2024-05-01T10:11:12.1234567891Z"}',  # more than nanoseconds
    b'{"id": 1, "ts": "2024-05-01T10:11Z"}',              # no seconds
    b'{"id": 1, "ts": " 2024-05-01T10:11:12Z"}',          # spaces (the Spark job trims them)
    b'{"id": 1, "ts": "1899-12-31T10:11:12Z"}',           # before 1900
    b'{"id": 1, "ts": "2024-05-01T10:11:12+0530"}',       # an offset spelled otherwise
    b'{"id": 1, "local": "2024-05-01T10:11:12Z"}',        # an offset for a timestamp without zone
    b'{"id": 1, "d": "2024-05-01T10:11:12"}',             # a timestamp for a date
    b'{"id": 1, "ts": "+1714608000000"}',                 # epoch milliseconds as text with a sign
    b'{"id": 1, "ts": "253402300800000"}',                # ... after 9999
    b'{"id": 1, "ts": 1714608000000.0}',                  # ... or with a fraction
    b'{"id": 1, "ts": 253402300800000}',                  # after 9999
    b'{"id": 1, "ts": 1714608000000}\n{"id": 2, "ts": "2024-05-01"}',  # both ways in one request
    b'{"id": 1, "ts": true}',
])
def test_times_this_way_is_not_sure_of_refuse_the_batch(tmp_path, body: bytes) -> None:  # noqa: ANN001
    answers = run_timed(tmp_path, {"r1": b'{"id": 7, "ts": "2024-05-01T10:11:12Z"}', "r2": body}, [("ts", "day")])
    assert answers[-1]["refused"] and not any(answer["path"] for answer in answers)
    assert not list((tmp_path).rglob("*.parquet"))


def test_epoch_milliseconds_and_days_sent_as_text_are_read_as_the_conversion_rules_read_them(tmp_path) -> None:  # noqa: ANN001
    """Digits alone in a time column's text are epoch milliseconds (days for a date), beside ISO
    8601 in the same request, as the full job's conversion reads them."""
    answers = run_timed(tmp_path, {
        "r": b'{"id": 1, "ts": "1714608000000", "local": "-1", "d": "19844"}\n{"id": 2, "ts": "2024-05-01T10:11:12Z", "d": "-25567"}\n'
             b'{"id": 3, "ts": "-2208988800000", "local": "2024-05-02 03:04:05"}',
    }, [("ts", "day")])
    assert all(answer["refused"] is None for answer in answers) and json.loads(answers[-1]["counts"]) == {"r": 3}
    rows = {row["id"]: row for answer in answers for row in pq.read_table(answer["path"]).to_pylist()}
    assert rows[1] == {"id": 1, "ts": utc(2024, 5, 2), "local": datetime(1969, 12, 31, 23, 59, 59, 999000), "d": date(2024, 5, 1), "msg": None}
    assert (rows[2]["ts"], rows[2]["d"]) == (utc(2024, 5, 1, 10, 11, 12), date(1900, 1, 1))
    assert (rows[3]["ts"], rows[3]["local"]) == (utc(1900, 1, 1), datetime(2024, 5, 2, 3, 4, 5))


def test_requests_may_send_times_either_way(tmp_path) -> None:  # noqa: ANN001
    answers = run_timed(tmp_path, {f"r{i}": body for i, body in enumerate([
        b'{"id": 1, "ts": 1714608000000}', b'{"id": 2, "ts": "2024-05-02T00:00:00Z"}', b'{"id": 3, "ts": 1714608000001}',
    ])}, [])
    assert [answer["refused"] for answer in answers] == [None]
    assert [row["ts"] for row in pq.read_table(answers[0]["path"]).to_pylist()] == [utc(2024, 5, 2), utc(2024, 5, 2), utc(2024, 5, 2, 0, 0, 0, 1000)]


def test_truncate_and_identity_partitions_group_rows_by_their_values(tmp_path) -> None:  # noqa: ANN001
    answers = run_timed(tmp_path, {"r": b'{"id": 1, "msg": "\u65e5\u672c\u8a9e"}\n{"id": 2, "msg": "\u65e5\u672cx"}\n{"id": 1, "msg": "ab"}\n{"id": 3}'},
                        [("msg", "truncate[2]"), ("id", "identity")])
    groups = sorted(sorted((row["id"], row["msg"]) for row in pq.read_table(answer["path"]).to_pylist()) for answer in answers)
    assert groups == [[(1, "ab")], [(1, "日本語")], [(2, "日本x")], [(3, None)]]


@pytest.mark.parametrize(("days", "users"), [
    ([1, 1, 1, 1], ["a", "a", "a", "a"]),  # one partition value: no sort
    ([1, 1, 2, 2], ["a", "a", "a", "a"]),  # the last key ascending: no sort
    ([2, 1, 2, 1], ["a", "a", "a", "a"]),  # sorted: a file per day
    ([1, 1, 1, 1], ["b", "a", "b", "a"]),
    ([1, 2, 1, 2], ["a", "a", "b", "b"]),  # the first key not one value: sorted
], ids=["one", "ascending", "days", "users", "both"])
def test_rows_in_partition_order_or_not_give_one_file_per_value_with_the_rows_in_their_order(tmp_path, days: list[int], users: list[str]) -> None:  # noqa: ANN001
    schema = pa.schema([("id", pa.int64()), ("day", pa.date32()), ("user", pa.string())])
    data = pa.table({"id": range(4), "day": pa.array([date(2025, 1, d) for d in days], pa.date32()), "user": users}, schema=schema)
    written = write_partitioned(data, str(tmp_path), pafs.LocalFileSystem(), schema, [("user", "identity"), ("day", "day")])
    files = {(row["user"], row["day"]): [r["id"] for r in pq.read_table(path).to_pylist()] for path, _rows, _key in written
             for row in pq.read_table(path).slice(0, 1).to_pylist()}
    expected: dict = {}
    for index, (day, user) in enumerate(zip(days, users)):
        expected.setdefault((user, date(2025, 1, day)), []).append(index)
    assert files == expected and len(written) == len(expected)


LABELLED = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "labels", MapType(3, StringType(), 4, StringType())),
).as_arrow()
LABELLED_EXTRA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "labels", MapType(3, StringType(), 4, StringType())),
    NestedField(5, "_extra", MapType(6, StringType(), 7, StringType())),
).as_arrow()


@pytest.mark.parametrize("last", [b'{"id": 6, "labels": {"z": "y"}}', b'{"id": 6, "labels": {"z": "null"}}', b'{"id": 6, "labels": {"z": "2025-11-22"}}'],
                         ids=["columns", "lines", "text-pyarrow-reads-as-a-time"])
def test_maps_of_strings_keep_each_events_entries_in_key_order_and_anything_else_refuses(tmp_path, last: bytes) -> None:  # noqa: ANN001
    # Read from pyarrow's structs, or (a line that may hold a JSON null where a key is absent, or
    # text pyarrow took for a time) from the lines again: the same entries, in key order, as the
    # Spark job writes them.
    (answer,) = answers(tmp_path / "plain", {"r1": b'{"id": 1, "labels": {"b": "2", "a": "1"}}\n{"id": 2, "labels": {"c": "", "a": "x"}}\n'
                                                   b'{"id": 3}\n{"id": 4, "labels": null}\n{"id": 5, "labels": {}}\n' + last}, LABELLED, None, [])
    assert answer["refused"] is None and json.loads(answer["counts"]) == {"r1": 6}
    assert pq.read_table(answer["path"]).column("labels").to_pylist() == [
        [("a", "1"), ("b", "2")], [("a", "x"), ("c", "")], None, None, [], [("z", json.loads(last)["labels"]["z"])],
    ]
    for odd in (b'{"a": null}', b'{"a": 1}', b'{"a": {"b": "c"}}', b'"text"', b'{"a": "x", "a": "y"}', b"[]"):
        (refused,) = answers(tmp_path / "odd", {"r1": b'{"id": 1, "labels": {"a": "x"}}\n{"id": 2, "labels": ' + odd + b"}"}, LABELLED, None, [])
        assert refused["refused"] and refused["path"] is None, odd
    (unknown,) = answers(tmp_path / "unknown", {"r1": b'{"id": 1, "labels": {"a": "x"}, "other": 1}'}, LABELLED, None, [])
    assert "a field the table lacks" in unknown["refused"]



def test_after_a_body_of_maps_with_many_keys_the_lines_give_the_maps_and_the_fields_the_table_lacks(tmp_path) -> None:  # noqa: ANN001
    # A key per event in the first body: pyarrow would infer a struct field per key (~40 ms per
    # 1,000 events at 1,000 keys); the bodies after it read the maps from the lines, as rows alike.
    many = b"\n".join(b'{"id": %d, "labels": {"k%d": "v"}}' % (i, i) for i in range(100, 116))
    body = b'{"id": 1, "labels": {"b": "2", "a": "1"}}\n{"id": 2}\n{"id": 3, "labels": null}\n{"id": 4, "labels": {"c": "", "a": "x", "a": "y"}}'
    (alone,) = answers(tmp_path / "alone", {"r2": body.replace(b'"a": "x", ', b"")}, LABELLED, None, [])
    (after,) = answers(tmp_path / "after", {"r1": many, "r2": body}, LABELLED, None, [])
    assert after["refused"] is None and json.loads(after["counts"]) == {"r1": 16, "r2": 4}
    rows = {row["id"]: row["labels"] for row in pq.read_table(after["path"]).to_pylist()}
    assert rows[100] == [("k100", "v")] and [rows[i] for i in (1, 2, 3, 4)] == pq.read_table(alone["path"]).column("labels").to_pylist()
    assert [rows[i] for i in (1, 2, 3, 4)] == [[("a", "1"), ("b", "2")], None, None, [("a", "y"), ("c", "")]]
    for odd in (b'{"id": 5, "other": 1}', b'{"id": 5, "labels": {"a": 1}}', b'{"id": 5, "labels": {"a": null}}', b'{"id": 5, "labels": "x"}'):
        (refused,) = answers(tmp_path / "odd", {"r1": many, "r2": odd}, LABELLED, None, [])
        assert refused["refused"] and refused["path"] is None, odd
    (extra,) = answers(tmp_path / "extra", {"r1": many, "r2": b'{"id": 5, "labels": {"z": "1"}, "other": 1}'}, LABELLED_EXTRA, "_extra", [])
    assert [(row["id"], row["labels"], row["_extra"]) for row in pq.read_table(extra["path"]).to_pylist() if row["id"] == 5] == [
        (5, [("z", "1")], [("other", "1")])]



def test_with_processors_maps_are_read_as_without_and_a_drop_leaves_fields_the_table_lacks_out(tmp_path) -> None:  # noqa: ANN001
    # The Spark job reads the map columns its processors left alone as maps (convert._read_late):
    # a key "", objects without a key and text in one event read as they do without processors.
    # A drop of a field the table lacks leaves it out; named in other letter case (which Spark's
    # drop ignores) it refuses the request, as does a field no drop names (no extra_fields here).
    from service.pipelines.spec import Processor
    from spark_jobs.plain_processors import plan

    steps = plan([Processor(where="id > 1"), Processor(drop=["debug"])], LABELLED, None)
    assert steps is not None
    assert plan([Processor(drop=["ID"])], LABELLED, None) is None  # a column of the table: the Spark job's

    def run(body: bytes) -> dict:
        append = _appender(str(tmp_path / "batch"), pafs.LocalFileSystem(), parse_schema(LABELLED, None), LABELLED, frozenset({"id"}), None, [],
                           processors=steps)
        batch = pa.record_batch({"receipt": ["r1"], "body": pa.array([body], pa.large_binary()), "seq": pa.array([0], pa.int64())})
        return [row for out in append(iter([batch])) for row in out.to_pylist()][-1]

    def labels(answer: dict) -> list:
        assert answer["refused"] is None, answer
        return pq.read_table(answer["path"]).column("labels").to_pylist()

    assert labels(run(b'{"id": 1, "labels": {"b": "1"}}\n{"id": 2, "labels": {"b": "2", "a": "3"}}\n{"id": 3, "labels": {}}')) == [[("a", "3"), ("b", "2")], []]
    assert labels(run(b'{"id": 2, "labels": {}}\n{"id": 3}')) == [[], None]
    assert labels(run(b'{"id": 2, "labels": {"": "x", "a": "1"}, "debug": {"deep": [1]}}')) == [[("", "x"), ("a", "1")]]
    assert "object" in run(b'{"id": 2, "labels": {"a": "1"}}\n{"id": 3, "labels": "text"}')["refused"]
    assert "other letter case" in run(b'{"id": 2, "Debug": 1}')["refused"]
    assert "lacks" in run(b'{"id": 2, "trace": 1}')["refused"]
    # A table without maps and without extra_fields: a field no drop names is refused there too
    # (the drops make pyarrow infer the fields the table lacks instead of refusing them itself).
    plain = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("msg", pa.string())])
    append = _appender(str(tmp_path / "plain"), pafs.LocalFileSystem(), parse_schema(plain, None), plain, frozenset({"id"}), None, [],
                       processors=plan([Processor(drop=["debug"])], plain, None))

    def answer(body: bytes) -> dict:
        batch = pa.record_batch({"receipt": ["r1"], "body": pa.array([body], pa.large_binary()), "seq": pa.array([0], pa.int64())})
        return [row for out in append(iter([batch])) for row in out.to_pylist()][-1]

    assert "lacks: 'trace'" in answer(b'{"id": 2, "debug": 1, "trace": 1}')["refused"]
    assert pq.read_table(answer(b'{"id": 3, "debug": {"x": 1}, "msg": "m"}')["path"]).to_pylist() == [{"id": 3, "msg": "m"}]


def test_a_where_reads_a_maps_values_by_key(tmp_path) -> None:  # noqa: ANN001
    # `labels.job` and `labels['job']` read the value of key "job", NULL where the map lacks it
    # or is absent, as Spark reads a map column; the map itself, or its value against a number,
    # is not planned (the Spark job's).
    from service.pipelines.spec import Processor
    from spark_jobs.plain_processors import plan

    for where in ("labels = 'x'", "labels.job = 5", "labels[1] = 'x'", "labels.job.x = 'a'", "labels.job + 1 > 2"):
        assert plan([Processor(where=where)], LABELLED, None) is None, where
    body = b'{"id": 1, "labels": {"job": "a"}}\n{"id": 2, "labels": {"job": "b", "x": "1"}}\n{"id": 3, "labels": {}}\n{"id": 4}'

    def kept(where: str) -> list[int]:
        append = _appender(str(tmp_path / "batch"), pafs.LocalFileSystem(), parse_schema(LABELLED, None), LABELLED, frozenset({"id"}), None, [],
                           processors=plan([Processor(where=where)], LABELLED, None))
        batch = pa.record_batch({"receipt": ["r1"], "body": pa.array([body], pa.large_binary()), "seq": pa.array([0], pa.int64())})
        answer = [row for out in append(iter([batch])) for row in out.to_pylist()][-1]
        assert answer["refused"] is None, answer
        return sorted(pq.read_table(answer["path"]).column("id").to_pylist()) if answer["path"] else []

    assert kept("labels.job = 'a'") == [1]
    assert kept("labels.job = 'c'") == []  # a where that keeps no event: nothing written, nothing refused
    assert kept("labels['job'] != 'a'") == [2]
    assert kept("labels.job IS NULL") == [3, 4]
    assert kept("labels.job IN ('a', 'b') AND labels.x IS NOT NULL") == [2]


def test_a_rename_onto_a_column_of_the_table_is_read_at_the_parse_and_both_names_refuse(tmp_path) -> None:  # noqa: ANN001
    # The old name is parsed as the new name's column (its type), and the steps after the rename
    # read it; an event with the new name too, or either in other letter case, refuses its
    # request (Spark would hold two columns of one name). Renames the short way does not take:
    # of a column of the table, onto a field it lacks, onto one a step before reads, twice onto one.
    from service.pipelines.spec import Processor
    from spark_jobs.plain_processors import plan

    for processors in ([Processor(rename={"msg": "n"})], [Processor(rename={"Msg": "text"})], [Processor(rename={"m": "text"})],
                       [Processor(rename={"m": "_extra"})], [Processor(where="msg = 'a'"), Processor(rename={"m": "msg"})],
                       [Processor(set={"msg": "'a'"}), Processor(rename={"m": "msg"})], [Processor(rename={"m": "msg", "k": "msg"})],
                       [Processor(rename={"m": "msg"}), Processor(rename={"M": "n"})],
                       [Processor(rename={"m": "msg"}), Processor(drop=["M"])]):
        assert plan(processors, TABLE, "_extra") is None, processors
    def run(body: bytes) -> list[dict] | str:
        processors = [Processor(where="x IS NULL"), Processor(rename={"message": "msg", "num": "n"}), Processor(where="n > 1")]
        return processed(tmp_path, processors, body, ["id", "msg", "n"])

    assert run(b'{"id": 1, "message": "a", "num": 2}\n{"id": 2, "num": 5}\n{"id": 3, "num": 0}\n{"id": 4, "num": 9, "x": 1.5}') == [
        {"id": 1, "msg": "a", "n": 2}, {"id": 2, "msg": None, "n": 5}]
    assert "a rename" in run(b'{"id": 1, "message": "a", "num": 2}\n{"id": 2, "msg": null}')
    assert "a rename" in run(b'{"id": 1, "Message": "a", "num": 2}')
    assert "a rename" in run(b'{"id": 1, "num": 2, "N": 3}')


def test_a_drop_of_a_column_of_the_table_writes_it_null_from_the_drop_on(tmp_path) -> None:  # noqa: ANN001
    # The Spark job drops the field and then writes the column it lacks as NULL: a where before
    # the drop reads its values, and the rows hold NULL. Drops the short way does not take: of a
    # required column (its NULLs are dead letters there), of the extras map (no field of the
    # events), in other letter case, of a column a later step reads or sets, or a rename gives.
    from service.pipelines.spec import Processor
    from spark_jobs.plain_processors import plan

    for processors in ([Processor(drop=["id"])], [Processor(drop=["_extra"])], [Processor(drop=["Msg"])],
                       [Processor(drop=["msg"]), Processor(where="msg IS NULL")], [Processor(drop=["n"]), Processor(set={"n": "1"})],
                       [Processor(drop=["msg"]), Processor(rename={"m": "msg"})]):
        assert plan(processors, TABLE, "_extra") is None, processors
    assert plan([Processor(drop=["n"])], TABLE, "_extra", frozenset({"n"})) is None, "a column the table requires"

    def run(body: bytes) -> list[dict] | str:
        processors = [Processor(where="coalesce(msg, '') != 'skip'"), Processor(drop=["msg", "debug"]), Processor(set={"n": "n + 1"})]
        return processed(tmp_path, processors, body, ["id", "msg", "n"])

    assert run(b'{"id": 1, "msg": "a", "n": 2, "debug": true}\n{"id": 2, "msg": "skip"}\n{"id": 3, "n": 7}') == [
        {"id": 1, "msg": None, "n": 3}, {"id": 3, "msg": None, "n": 8}]
    assert "a drop" in run(b'{"id": 1, "msg": "a", "MSG": "b"}'), "a field in other letter case, which Spark's drop takes too"


def processed(directory: Path, processors: list, body: bytes, columns: list[str]) -> list[dict] | str:
    """The `columns` of the rows the short way writes of one request `body` through `processors`
    (planned over TABLE), or why it refused the request."""
    from spark_jobs.plain_processors import plan

    steps = plan(processors, TABLE, "_extra")
    assert steps is not None, processors
    append = _appender(str(directory / f"batch-{uuid.uuid4().hex}"), pafs.LocalFileSystem(), parse_schema(TABLE, "_extra"), TABLE,
                       frozenset({"id"}), "_extra", [], processors=steps)
    batch = pa.record_batch({"receipt": ["r1"], "body": pa.array([body], pa.large_binary()), "seq": pa.array([0], pa.int64())})
    answer = [row for out in append(iter([batch])) for row in out.to_pylist()][-1]
    return answer["refused"] or pq.read_table(answer["path"]).select(columns).to_pylist()


def test_functions_of_text_coalesce_and_case_are_applied_over_one_kind_and_lower_of_other_than_ascii_refuses(tmp_path) -> None:  # noqa: ANN001
    # Java's case rules and utf8proc's agree on ASCII only: a request lowering other text is the
    # Spark job's. Values Spark would widen (an integer beside a decimal, a double), other
    # functions, and trims of other characters are not planned.
    from service.pipelines.spec import Processor
    from spark_jobs.plain_processors import plan

    for refused in ({"x": "coalesce(x, 0)"}, {"msg": "lower(n)"}, {"msg": "trim(BOTH 'x' FROM msg)"}, {"n": "coalesce(n, 1.5)"},
                    {"msg": "CASE WHEN ok THEN 'a' ELSE 1 END"}, {"msg": "substring(msg, 1, 2)"}, {"n": "length(n)"},
                    {"msg": "concat(msg, n)"}, {"ok": "CASE WHEN msg THEN true END"}, {"msg": "IF(ok, 'a')"},
                    {"msg": "concat_ws('-', msg, 'a')"}, {"msg": "nvl2(msg, 'a', 'b')"}, {"msg": "initcap(msg)"}):
        assert plan([Processor(set=refused)], TABLE, "_extra") is None, refused

    def run(processors: list, body: bytes) -> list[dict] | str:
        return processed(tmp_path, processors, body, ["id", "msg", "n", "ok"])

    body = b'{"id": 1, "msg": " Ab ", "n": 1, "ok": true}\n{"id": 2, "n": 12}\n{"id": 3, "msg": "z", "n": -4, "ok": false}'
    assert run([Processor(set={"msg": "upper(trim(msg))", "n": "coalesce(length(msg), n)"})], body) == [
        {"id": 1, "msg": "AB", "n": 4, "ok": True}, {"id": 2, "msg": None, "n": 12, "ok": None}, {"id": 3, "msg": "Z", "n": 1, "ok": False}]
    assert run([Processor(set={"msg": "CASE WHEN n > 10 THEN 'big' WHEN n < 0 THEN 'negative' ELSE msg || '!' END", "ok": "IF(ok, NULL, true)"})],
               body) == [{"id": 1, "msg": " Ab !", "n": 1, "ok": None}, {"id": 2, "msg": "big", "n": 12, "ok": True},
                         {"id": 3, "msg": "negative", "n": -4, "ok": True}]
    assert run([Processor(where="coalesce(ok, true) AND CASE n WHEN 1 THEN true WHEN 12 THEN concat(msg, 'x') IS NULL END")], body) == [
        {"id": 1, "msg": " Ab ", "n": 1, "ok": True}, {"id": 2, "msg": None, "n": 12, "ok": None}]
    assert "beyond ASCII" in run([Processor(set={"msg": "lower(msg)"})], '{"id": 1, "msg": "ÉCOLE"}'.encode())


def test_arithmetic_of_integers_and_doubles_is_applied_and_a_result_the_spark_job_may_hold_otherwise_refuses(tmp_path) -> None:  # noqa: ANN001
    # The Spark job's integers are bigints (literals and length(): 32 bits), an integral batch's
    # doubles bigints too, its `/` a double's division with NULL for a divisor of 0 and a decimal
    # literal's arithmetic decimal: a result that may differ refuses the request (the Spark job's).
    from service.pipelines.spec import Processor
    from spark_jobs.plain_processors import plan

    for refused in ({"x": "x * 1.5"}, {"n": "x div 2"}, {"n": "n / 2"}, {"x": "msg + 1"}, {"x": "NULL + NULL"},
                    {"ok": "ok + 1"}, {"n": "x + 1"}):
        assert plan([Processor(set=refused)], TABLE, "_extra") is None, refused

    def run(processors: list, body: bytes) -> list[dict] | str:
        return processed(tmp_path, processors, body, ["id", "n", "x"])

    body = b'{"id": 1, "n": 0, "x": 0.5}\n{"id": 2, "n": 2, "x": 3}\n{"id": 3, "x": 2.5}\n{"id": 4, "n": -3}'
    assert run([Processor(set={"n": "n * 2 - 1", "x": "x / n"})], body) == [
        {"id": 1, "n": -1, "x": None}, {"id": 2, "n": 3, "x": 1.5}, {"id": 3, "n": None, "x": None}, {"id": 4, "n": -7, "x": None}]
    assert run([Processor(where="x * 2 > n OR -n > 2"), Processor(set={"x": "(x + 1) / 4"})], body) == [
        {"id": 1, "n": 0, "x": 0.375}, {"id": 2, "n": 2, "x": 1.0}, {"id": 4, "n": -3, "x": None}]
    assert "2**31" in run([Processor(set={"n": "length(msg) * 1000000000"})], b'{"id": 1, "msg": "abc"}')  # an int's, in Spark
    assert run([Processor(set={"n": "11 % n", "x": "x % 2 + n div 2"})], body) == [  # Java's %, NULL for a divisor of 0
        {"id": 1, "n": None, "x": 0.5}, {"id": 2, "n": 1, "x": 2.0}, {"id": 3, "n": None, "x": None}, {"id": 4, "n": 2, "x": None}]
    assert isinstance(run([Processor(set={"n": "n * 1000000000"})], b'{"id": 1, "n": 3}'), str)  # a bigint, but beyond n's int
    assert "2**53" in run([Processor(set={"x": "x * 4503599627370496"})], b'{"id": 1, "x": 3}')
    assert "-0.0" in run([Processor(set={"x": "-x"})], b'{"id": 1, "x": 0}')
    assert "-0" in run([Processor(where="n > 0")], b'{"id": 1, "n": 1, "x": -0}')


def test_casts_are_applied_where_spark_reads_them_alike_and_other_text_or_an_overflow_refuses(tmp_path) -> None:  # noqa: ANN001
    # Spark (ANSI off) reads text as an integer its own way (trimmed, a sign, a fraction
    # truncated, NULL for anything else): only digits are cast here ("0x1f" is 31 to pyarrow). A
    # double becomes an integer truncated; a cast to INT is 32 bits in Spark's arithmetic.
    from service.pipelines.spec import Processor
    from spark_jobs.plain_processors import plan

    for refused in ({"msg": "cast(x as string)"}, {"n": "cast(x as decimal(3,1))"}, {"ok": "cast(x as boolean)"}, {"x": "cast(ok as double)"}):
        assert plan([Processor(set=refused)], TABLE, "_extra") is None, refused

    def run(processors: list, body: bytes) -> list[dict] | str:
        return processed(tmp_path, processors, body, ["id", "msg", "n", "x"])

    body = b'{"id": 1, "msg": "007", "x": 3.9, "ok": true}\n{"id": 2, "msg": "-12", "x": -2.7, "ok": false}\n{"id": 3}'
    assert run([Processor(set={"n": "CAST(msg AS INT) + cast(x as int)", "x": "cast(cast(ok as int) as double)"})], body) == [
        {"id": 1, "msg": "007", "n": 10, "x": 1.0}, {"id": 2, "msg": "-12", "n": -14, "x": 0.0}, {"id": 3, "msg": None, "n": None, "x": None}]
    assert run([Processor(where="int(msg) > 0"), Processor(set={"msg": "concat(cast(ok as string), cast(cast(x as bigint) as string))"})], body) == [
        {"id": 1, "msg": "true3", "n": None, "x": 3.9}]
    for text in ("0x1f", " 5", "+4", "1.9"):
        assert "digits" in run([Processor(set={"n": "cast(msg as int)"})], b'{"id": 1, "msg": "%s"}' % text.encode()), text
    assert isinstance(run([Processor(set={"n": "cast(msg as int)"})], b'{"id": 1, "msg": "99999999999"}'), str)  # beyond an int
    assert isinstance(run([Processor(set={"n": "cast(x as int)"})], b'{"id": 1, "x": 3000000000.5}'), str)  # Spark saturates or wraps
    assert "2**31" in run([Processor(set={"n": "cast(msg as int) * 1000"})], b'{"id": 1, "msg": "3000000"}')  # an int's product, in Spark
    # Text to doubles where it is a decimal number, to booleans where it is one of Spark's words
    # (in either case); integers to booleans. Other spellings Spark reads its own way: refused.
    texts = b'{"id": 1, "msg": "-12.5", "n": 0}\n{"id": 2, "msg": "1E3", "n": 7}\n{"id": 3, "n": null}'
    assert processed(tmp_path, [Processor(set={"x": "cast(msg as double)", "ok": "cast(n as boolean)"})], texts, ["id", "x", "ok"]) == [
        {"id": 1, "x": -12.5, "ok": False}, {"id": 2, "x": 1000.0, "ok": True}, {"id": 3, "x": None, "ok": None}]
    words = b'{"id": 1, "msg": "YES"}\n{"id": 2, "msg": "f"}\n{"id": 3, "msg": "0"}\n{"id": 4}'
    assert processed(tmp_path, [Processor(set={"ok": "cast(msg as boolean)"})], words, ["id", "ok"]) == [
        {"id": 1, "ok": True}, {"id": 2, "ok": False}, {"id": 3, "ok": False}, {"id": 4, "ok": None}]
    for text in ("1d", "Infinity", " 2", ".5", "0x1p3"):
        assert "a decimal number" in run([Processor(set={"x": "cast(msg as double)"})], b'{"id": 1, "msg": "%s"}' % text.encode()), text
    assert isinstance(run([Processor(set={"x": "cast(msg as double)"})], b'{"id": 1, "msg": "1e400"}'), str)  # infinite
    for text in (" yes", "on", "tru", "\u017f"):  # the long s: RE2's (?i) folds it to s, Java's lower-casing does not
        assert "true and false" in run([Processor(set={"ok": "cast(msg as boolean)"})], b'{"id": 1, "msg": "%s"}' % text.encode()), text


AMOUNTS = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "amount", DecimalType(10, 2)),
    NestedField(3, "blob", BinaryType()),
).as_arrow()


def test_decimals_from_numbers_and_text_and_binary_from_base64(tmp_path) -> None:  # noqa: ANN001
    (answer,) = answers(tmp_path, {"r": b'{"id": 1, "amount": 12.5, "blob": "QUJD"}\n{"id": 2, "amount": "-99999999.99", "blob": ""}\n'
                                        b'{"id": 3, "amount": 1e3}\n{"id": 4, "amount": "0.10", "blob": null}'}, AMOUNTS, None, [])
    assert answer["refused"] is None
    rows = pq.read_table(answer["path"]).to_pylist()
    assert [(row["amount"], row["blob"]) for row in rows] == [
        (Decimal("12.50"), b"ABC"), (Decimal("-99999999.99"), b""), (Decimal("1000.00"), None), (Decimal("0.10"), None),
    ]


@pytest.mark.parametrize("field", [
    '"amount": 12.505',          # more digits than the scale: the Spark job rounds half up
    '"amount": 100000000',       # more than the precision: the Spark job's NULL
    '"amount": "-100000000.5"',
    '"amount": " 1.5"',          # spaces: the Spark job trims them
    '"amount": "1,5"',
    '"blob": "QQ"',              # base64 without its padding
    '"blob": "QR=="',            # unused bits not zero
    '"blob": "QU JD"',
    '"blob": 12',
])
def test_decimals_and_binary_this_way_is_not_sure_of_refuse_the_batch(tmp_path, field: str) -> None:  # noqa: ANN001
    answers_ = answers(tmp_path, {"r1": b'{"id": 7, "amount": 1.5}', "r2": f'{{"id": 1, {field}}}'.encode()}, AMOUNTS, None, [])
    assert answers_[-1]["refused"] and not any(answer["path"] for answer in answers_)


def test_murmur3_in_python_is_mmh3s() -> None:
    import random

    import mmh3

    chance = random.Random(7)
    for size in [*range(12), 100, 1001]:
        data = bytes(chance.randrange(256) for _ in range(size))
        assert murmur3_32(data) == mmh3.hash(data, signed=False), data


@pytest.mark.parametrize(("values", "arrow_type", "iceberg_type"), [
    ([0, 1, -1, 34, 2**40, -(2**63), None], pa.int64(), LongType()),
    ([0, 7, -7, 2**31 - 1, None], pa.int32(), IntegerType()),
    (["", "iceberg", "日本語", "😀", None], pa.large_string(), StringType()),
    ([b"", b"\x00\xff", b"abcde", None], pa.large_binary(), BinaryType()),
    ([date(2017, 11, 16), date(1900, 1, 1), None], pa.date32(), DateType()),
    ([datetime(2017, 11, 16, 22, 31, 8), datetime(1969, 12, 31, 23, 59, 59, 999999), None], pa.timestamp("us"), TimestampType()),
    ([utc(2017, 11, 16, 22, 31, 8), None], pa.timestamp("us", "UTC"), TimestamptzType()),
])
def test_buckets_are_icebergs(values: list, arrow_type: pa.DataType, iceberg_type) -> None:  # noqa: ANN001
    column = pa.chunked_array([pa.array(values, arrow_type)] * 2)
    expected = [BucketTransform(16).transform(iceberg_type)(_iceberg_value(value)) for value in values] * 2
    assert buckets(column, 16).to_pylist() == expected


def _iceberg_value(value: object) -> object:
    """A Python value as pyiceberg's transforms take it: days and microseconds for dates and times."""
    if isinstance(value, datetime):
        aware = value if value.tzinfo else value.replace(tzinfo=timezone.utc)
        return (aware - datetime(1970, 1, 1, tzinfo=timezone.utc)) // timedelta(microseconds=1)
    if isinstance(value, date):
        return (value - date(1970, 1, 1)).days
    return value


def test_bucket_and_integer_truncate_partitions_write_one_file_per_value(tmp_path) -> None:  # noqa: ANN001
    body = "\n".join(json.dumps({"id": i, "msg": f"user-{i % 7}"}) for i in range(-30, 30)).encode()
    answers_ = run_timed(tmp_path, {"r": body}, [("msg", "bucket[3]"), ("id", "truncate[10]")])
    bucket_of = BucketTransform(3).transform(StringType())
    keys = []
    for answer in answers_:
        rows = pq.read_table(answer["path"]).to_pylist()
        (key,) = {(bucket_of(row["msg"]), row["id"] - row["id"] % 10) for row in rows}  # Python's % rounds down, as Iceberg's truncate
        keys.append(key)
    assert len(keys) == len(set(keys)) and sum(pq.read_metadata(a["path"]).num_rows for a in answers_) == 60


def test_a_bucket_file_names_its_bucket_and_the_committer_takes_it_without_reading_the_column(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """The short way's files of a bucket[3] table name their bucket in their metadata; the
    committer's DataFile takes it from there (no column read: `partition_values` is made to fail),
    and reads the values for a transform the file does not name (the table's bucket[5] now)."""
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.partitioning import PartitionField, PartitionSpec

    from service.iceberg import appends

    body = "\n".join(json.dumps({"id": i, "msg": f"user-{i % 7}", "d": "2026-12-0" + str(1 + i % 2)}) for i in range(60)).encode()
    files = [answer["path"] for answer in run_timed(tmp_path, {"r": body}, [("d", "day"), ("msg", "bucket[3]")])]
    bucket_of = BucketTransform(3).transform(StringType())
    expected = {}
    for path in files:
        (bucket,) = {bucket_of(row["msg"]) for row in pq.read_table(path).to_pylist()}
        assert json.loads(pq.read_metadata(path).metadata[b"calve.buckets"]) == [["msg", "bucket[3]", bucket]]
        expected[path] = bucket
    assert len(files) > 3

    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=(tmp_path / "wh").as_uri())
    catalog.create_namespace("n")
    schema = Schema(*(f for f in TIMED_ICEBERG.fields))
    three = catalog.create_table(("n", "three"), schema, partition_spec=PartitionSpec(
        PartitionField(4, 1000, DayTransform(), "d_day"), PartitionField(5, 1001, BucketTransform(3), "msg_bucket")))
    five = catalog.create_table(("n", "five"), schema, partition_spec=PartitionSpec(PartitionField(5, 1000, BucketTransform(5), "msg_bucket")))
    read_back = appends.partition_values
    monkeypatch.setattr(appends, "partition_values", lambda *args: pytest.fail("read a column whose bucket the file names"))
    for path in files:
        assert appends.data_file(three.transaction(), path).partition[1] == expected[path]
    monkeypatch.setattr(appends, "partition_values", read_back)
    bucket_of_five = BucketTransform(5).transform(StringType())
    for path in files:
        found = {bucket_of_five(row["msg"]) for row in pq.read_table(path).to_pylist()}
        if len(found) == 1:
            assert appends.data_file(five.transaction(), path).partition[0] == found.pop()
        else:
            with pytest.raises(ValueError, match="values of partition msg_bucket"):
                appends.data_file(five.transaction(), path)


def test_a_jobs_task_pickles_its_code_once_per_process_and_runs_the_same_once_unpickled(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """Spark Connect pickles the task into every job's plan, by value: the task's code is pickled
    the first time only (spark_jobs/task_code.py), every later job pickling its arguments alone;
    unpickled, as a Spark worker does, the task writes what it writes in place."""
    import pickle

    from pyspark import cloudpickle
    from pyspark.serializers import CloudPickleSerializer

    from spark_jobs.direct_append import RESULT

    def task(directory: Path):  # noqa: ANN202
        return _appender(str(directory), pafs.LocalFileSystem(), parse_schema(TABLE, "_extra"), TABLE, frozenset({"id"}), "_extra", [])

    CloudPickleSerializer().dumps((task(tmp_path / "first"), RESULT))  # the code, pickled by this process's first job (or an earlier one)
    functions_pickled = []
    getstate = cloudpickle.cloudpickle._function_getstate
    monkeypatch.setattr(cloudpickle.cloudpickle, "_function_getstate", lambda function: functions_pickled.append(function) or getstate(function))
    shipped = CloudPickleSerializer().dumps((task(tmp_path / "second"), RESULT))
    assert functions_pickled == []
    monkeypatch.undo()

    unpickled, _schema = pickle.loads(shipped)
    batch = pa.record_batch({
        "receipt": ["r1"], "body": pa.array([b'{"id": 1, "msg": "a", "new": 2}\n{"id": 2}\n'], pa.large_binary()), "seq": pa.array([0], pa.int64()),
    })
    written = [row for out in unpickled(iter([batch])) for row in out.to_pylist()]
    assert [json.loads(row["counts"]) for row in written] == [{"r1": 2}]
    (path,) = [row["path"] for row in written]
    assert path.startswith(str(tmp_path / "second"))
    assert pq.read_table(path).select(["id", "msg"]).to_pylist() == [{"id": 1, "msg": "a"}, {"id": 2, "msg": None}]
    assert pq.read_table(path).column("_extra").to_pylist() == [[("new", "2")], None]


def test_text_that_cannot_be_a_number_in_an_optional_number_column_reads_as_null_and_the_rest_is_written(tmp_path) -> None:  # noqa: ANN001
    """text_nulls: "slow" where the table has a double (no digit, no nan or inf: Spark's cast
    reads NULL) is NULL there, its event and request written in their order; text Spark may read
    as a number, or in a required column, leaves its request to the Spark job."""
    parsing = parse_schema(TABLE, "_extra", [])
    append = _appender(str(tmp_path / "batch"), pafs.LocalFileSystem(), parsing, TABLE, frozenset({"id"}), "_extra", [], by_request=True,
                       text_nulls=True)
    bodies = [
        b'{"id": 1, "x": 1.5}\n{"id": 2, "x": "slow", "n": "n/a", "level": "warn"}\n\n{"id": 3, "x": 2}\n{"id": 4, "n": "", "msg": "m"}',
        b'{"id": 5, "x": " 1e3"}',  # a number to Spark, spelled as no plain number is: the Spark job's
        b'{"id": 6, "x": "Infinity"}',  # ... and so is a double's special word
        b'{"id": "seven"}',  # a required column
        b'{"id": 8, "x": "-"}\n{"id": 9, "x": "\\u0661"}',  # an Arabic-Indic digit: maybe a number, the request is the Spark job's
        b'{"id": 10, "n": " ", "x": 3}',
    ]
    batch = pa.record_batch({
        "receipt": [f"r{i}" for i in range(len(bodies))], "body": pa.array(bodies, pa.large_binary()),
        "seq": pa.array([index * LINE_SLOTS for index in range(len(bodies))], pa.int64()),
    })
    (answer,) = [row for out in append(iter([batch])) for row in out.to_pylist()]
    assert answer["refused"] is None and json.loads(answer["rejected"]) == [LINE_SLOTS * i for i in (1, 2, 3, 4)]
    assert json.loads(answer["counts"]) == {"r0": 4, "r5": 1}
    rows = [{k: v for k, v in row.items() if v is not None} for row in pq.read_table(answer["path"]).to_pylist()]
    assert rows == [{"id": 1, "x": 1.5}, {"id": 2, "_extra": [("level", "warn")]}, {"id": 3, "x": 2.0}, {"id": 4, "msg": "m"}, {"id": 10, "x": 3.0}]
    # Each request says which columns had values made NULL, and in how many of its events (the receipt's nulled_fields).
    assert json.loads(answer["nulled"]) == {"r0": [["n", "x"], 2], "r5": [["n"], 1]}


def test_numbers_sent_as_text_are_read_as_the_spark_job_converts_them_and_other_spellings_are_its(tmp_path) -> None:  # noqa: ANN001
    """text_nulls: a body whose number columns (a required one too) hold their values as text ("12", "-2.5e3": grok's
    captures, a logger that writes strings) is written, each converted as the Spark job's cast
    converts it (text that cannot be a number NULL), and the task's next body is read so first;
    text and numbers in one column are read so too (read_split: each text written into its line
    as its number); a spelling the cast may read otherwise ("+12", "1e3" or "12.0" for an
    integer) or a value beyond the column's range leaves its request to the Spark job."""
    parsing = parse_schema(TABLE, "_extra", [])
    append = _appender(str(tmp_path / "batch"), pafs.LocalFileSystem(), parsing, TABLE, frozenset({"id"}), "_extra", [], by_request=True,
                       text_nulls=True)
    bodies = [
        b'{"id": 1, "n": "12", "x": "2.5"}\n{"id": 2, "n": "-007", "x": "-1e3"}\n{"id": 3, "n": "n/a", "x": "123456789012345678901234567890"}\n'
        b'{"id": 4, "msg": "m"}',
        b'{"id": 5, "x": "0.1", "n": "2147483647"}',
        b'{"id": 6, "n": 8, "x": 0.5}',  # numbers again
        b'{"id": 7, "n": "+12"}',
        b'{"id": 8, "n": "1e3"}',
        b'{"id": 9, "n": "12.0"}',
        b'{"id": 10, "n": "2147483648"}',
        b'{"id": 11, "x": "1e999"}',
        b'{"id": 12, "n": "3"}\n{"id": 13, "n": 4}',
        b'{"id": 14, "n": "5"}\n{"id": 15, "n": "slow", "x": "4.25"}',
        b'{"id": "16", "x": "0.25"}',  # a required column's number as text too
        b'{"id": "17"}\n{"id": "n/a"}',  # ... but not its NULL: the Spark job's (the DLQ)
    ]
    batch = pa.record_batch({
        "receipt": [f"r{i}" for i in range(len(bodies))], "body": pa.array(bodies, pa.large_binary()),
        "seq": pa.array([index * LINE_SLOTS for index in range(len(bodies))], pa.int64()),
    })
    (answer,) = [row for out in append(iter([batch])) for row in out.to_pylist()]
    assert answer["refused"] is None and json.loads(answer["rejected"]) == [LINE_SLOTS * i for i in (*range(3, 8), 11)]
    assert json.loads(answer["counts"]) == {"r0": 4, "r1": 1, "r2": 1, "r8": 2, "r9": 2, "r10": 1}
    rows = [{k: v for k, v in row.items() if v is not None} for row in pq.read_table(answer["path"]).to_pylist()]
    assert rows == [{"id": 1, "n": 12, "x": 2.5}, {"id": 2, "n": -7, "x": -1000.0}, {"id": 3, "x": 1.2345678901234568e29}, {"id": 4, "msg": "m"},
                    {"id": 5, "n": 2147483647, "x": 0.1}, {"id": 6, "n": 8, "x": 0.5}, {"id": 12, "n": 3}, {"id": 13, "n": 4}, {"id": 14, "n": 5}, {"id": 15, "x": 4.25},
                    {"id": 16, "x": 0.25}]
    assert json.loads(answer["nulled"]) == {"r0": [["n"], 1], "r9": [["n"], 1]}


def test_integers_sent_with_a_fraction_or_an_exponent_are_read_as_the_spark_job_converts_them(tmp_path) -> None:  # noqa: ANN001
    """text_nulls: 12.0 or 1e3 in an integer column (pandas writes an integer column holding a NaN
    so) is that integer, as the Spark job converts it; a fraction (its NULL), an integer beyond
    what a double keeps beside such a number (its digits), or a value beyond the column's range
    leaves its request to the Spark job."""
    parsing = parse_schema(TABLE, "_extra", [])
    append = _appender(str(tmp_path / "batch"), pafs.LocalFileSystem(), parsing, TABLE, frozenset({"id"}), "_extra", [], by_request=True,
                       text_nulls=True)
    bodies = [
        b'{"id": 1.0, "n": 12.0, "x": 0.5}\n{"id": 2, "n": 1e3}\n{"id": 3e0, "n": -0.0}\n{"id": 4}',
        b'{"id": 5, "n": 7}',  # read as doubles first, as the body before
        b'{"id": 6, "n": "8", "x": "1.5"}\n{"id": 7.0, "n": "9"}',  # text and a whole double in one request
        b'{"id": 8, "n": 12.5}',
        b'{"id": 9007199254740993, "n": 1.0}',
        b'{"id": 10, "n": 3e9}',
    ]
    batch = pa.record_batch({
        "receipt": [f"r{i}" for i in range(len(bodies))], "body": pa.array(bodies, pa.large_binary()),
        "seq": pa.array([index * LINE_SLOTS for index in range(len(bodies))], pa.int64()),
    })
    (answer,) = [row for out in append(iter([batch])) for row in out.to_pylist()]
    assert answer["refused"] is None and json.loads(answer["rejected"]) == [LINE_SLOTS * i for i in (3, 4, 5)]
    assert json.loads(answer["counts"]) == {"r0": 4, "r1": 1, "r2": 2}
    rows = [{k: v for k, v in row.items() if v is not None} for row in pq.read_table(answer["path"]).to_pylist()]
    assert rows == [{"id": 1, "n": 12, "x": 0.5}, {"id": 2, "n": 1000}, {"id": 3, "n": 0}, {"id": 4}, {"id": 5, "n": 7},
                    {"id": 6, "n": 8, "x": 1.5}, {"id": 7, "n": 9}]


def test_numbers_sent_for_a_text_column_are_written_as_the_spark_job_spells_them(tmp_path) -> None:  # noqa: ANN001
    """text_nulls: ids sent as numbers where the table has text are their digits, as the Spark
    job writes a number read as text, and a number with a fraction or an exponent is spelled as
    Java spells its double (1000.0 for 1e3), beside text in the same column too (each event with a
    number then read alone); one whose spelling is unsure (from 1e16 on) leaves the request to the
    Spark job."""
    parsing = parse_schema(TABLE, "_extra", [])
    append = _appender(str(tmp_path / "batch"), pafs.LocalFileSystem(), parsing, TABLE, frozenset({"id"}), "_extra", [], by_request=True,
                       text_nulls=True)
    bodies = [
        b'{"id": 1, "msg": 12345}\n{"id": 2, "msg": -7, "n": 3}\n{"id": 3}',
        b'{"id": 4, "msg": "text"}',
        b'{"id": 5, "msg": 1.5}\n{"id": 51, "msg": 1e3}\n{"id": 52, "msg": 18446744073709551616}\n{"id": 53, "msg": -0}\n{"id": 54, "msg": 1E-4}',
        b'{"id": 6, "msg": 5}\n{"id": 7, "msg": "x"}',
        b'{"id": 8, "msg": 0, "n": 2.0}',  # and a whole double for an integer
        b'{"id": 9, "msg": 2.5, "n": 2.0}',  # a fraction in the text column, a whole double in the integer one
        b'{"id": 10, "msg": 1e20}',
    ]
    batch = pa.record_batch({
        "receipt": [f"r{i}" for i in range(len(bodies))], "body": pa.array(bodies, pa.large_binary()),
        "seq": pa.array([index * LINE_SLOTS for index in range(len(bodies))], pa.int64()),
    })
    (answer,) = [row for out in append(iter([batch])) for row in out.to_pylist()]
    assert answer["refused"] is None and json.loads(answer["rejected"]) == [LINE_SLOTS * 6]
    assert json.loads(answer["counts"]) == {"r0": 3, "r1": 1, "r2": 5, "r3": 2, "r4": 1, "r5": 1}
    rows = [{k: v for k, v in row.items() if v is not None} for row in pq.read_table(answer["path"]).to_pylist()]
    assert rows == [{"id": 1, "msg": "12345"}, {"id": 2, "msg": "-7", "n": 3}, {"id": 3}, {"id": 4, "msg": "text"},
                    {"id": 5, "msg": "1.5"}, {"id": 51, "msg": "1000.0"}, {"id": 52, "msg": "18446744073709551616"}, {"id": 53, "msg": "0"},
                    {"id": 54, "msg": "1.0E-4"}, {"id": 6, "msg": "5"}, {"id": 7, "msg": "x"}, {"id": 8, "msg": "0", "n": 2},
                    {"id": 9, "msg": "2.5", "n": 2}]


def test_numbers_and_text_in_one_text_column_are_read_in_groups_and_written_in_the_events_order(tmp_path) -> None:  # noqa: ANN001
    """text_nulls: a request whose text column holds numbers in many events and text in others
    (more than MAX_MISTYPED of either) is read in groups, each event's number spelled as the
    Spark job spells it, its fields the table lacks kept, the rows in the events' order."""
    parsing = parse_schema(TABLE, "_extra", [])
    append = _appender(str(tmp_path / "batch"), pafs.LocalFileSystem(), parsing, TABLE, frozenset({"id"}), "_extra", [], by_request=True,
                       text_nulls=True)
    values = [i if i % 3 == 0 else i + 0.5 if i % 3 == 1 else f"m{i}" for i in range(3 * MAX_MISTYPED)]
    body = b"\n".join(json.dumps({"id": i, "msg": value, **({"level": "warn"} if i % 5 == 0 else {})}).encode() for i, value in enumerate(values))
    batch = pa.record_batch({"receipt": ["r"], "body": pa.array([body], pa.large_binary()), "seq": pa.array([0], pa.int64())})
    (answer,) = [row for out in append(iter([batch])) for row in out.to_pylist()]
    assert answer["rejected"] is None and json.loads(answer["counts"]) == {"r": len(values)}
    rows = pq.read_table(answer["path"]).to_pylist()
    assert [row["id"] for row in rows] == list(range(len(values)))
    assert [row["msg"] for row in rows] == [str(v) if isinstance(v, (int, float)) else v for v in values]
    assert [row["_extra"] for row in rows] == [[("level", "warn")] if i % 5 == 0 else None for i in range(len(values))]


def test_after_a_request_read_in_groups_the_next_is_read_so_first_and_any_other_as_before(tmp_path) -> None:  # noqa: ANN001
    """text_nulls: the task's next body after one read in groups is read in groups first (its
    numbers as sent, an integer beyond 64 bits as its digits, whatever the order of its fields); a
    plain body after it (no text column's name before a number) is read as before, and so is one
    with text in a number column as well, which no group read takes."""
    parsing = parse_schema(TABLE, "_extra", [])
    append = _appender(str(tmp_path / "batch"), pafs.LocalFileSystem(), parsing, TABLE, frozenset({"id"}), "_extra", [], by_request=True,
                       text_nulls=True)
    mixed = [{"id": i, "msg": i if i % 2 else f"m{i}"} for i in range(2 * MAX_MISTYPED)]
    bodies = [
        [*mixed],
        [{"msg": 18446744073709551616, "id": 100}, {"id": 101, "msg": "t"}, {"msg": 2.5, "id": 102}, {"id": 103, "msg": -3}],
        [{"id": 200, "msg": "plain", "x": 1.5}, {"id": 201, "n": 2}],
        [*mixed],
        [{"id": 300, "msg": 7}, {"id": 301, "msg": "u"}, {"id": 302, "n": "slow"}, {"id": 303, "n": 4, "msg": 8}],
    ]
    batch = pa.record_batch({
        "receipt": [f"r{i}" for i in range(len(bodies))],
        "body": pa.array([b"\n".join(json.dumps(event).encode() for event in events) for events in bodies], pa.large_binary()),
        "seq": pa.array([index * LINE_SLOTS for index in range(len(bodies))], pa.int64()),
    })
    (answer,) = [row for out in append(iter([batch])) for row in out.to_pylist()]
    assert answer["refused"] is None and answer["rejected"] is None
    assert json.loads(answer["counts"]) == {f"r{i}": len(events) for i, events in enumerate(bodies)}
    assert json.loads(answer["nulled"]) == {"r4": [["n"], 1]}
    rows = [{k: v for k, v in row.items() if v is not None} for row in pq.read_table(answer["path"]).to_pylist()]
    def written(event: dict) -> dict:  # a number in msg as its digits (2.5 as Java spells it), "slow" for n as NULL
        row = {"id": event["id"], **({"n": event["n"]} if isinstance(event.get("n"), int) else {}), **({"x": event["x"]} if "x" in event else {})}
        return row | ({"msg": event["msg"] if isinstance(event["msg"], str) else str(event["msg"])} if "msg" in event else {})

    assert rows == [written(event) for events in bodies for event in events]


def counted_reader() -> tuple[BodyReader, list[tuple]]:
    """A BodyReader of TABLE whose reads (its own, real pyarrow reads) are listed, each by its arguments."""
    reader = BodyReader(parse_schema(TABLE, "_extra", []), TABLE, frozenset({"id"}), "_extra", [], False, None, True)
    reads, read = [], reader.read

    def counted(*args, **kwargs) -> pa.Table:  # noqa: ANN002, ANN003
        reads.append(args)
        return read(*args, **kwargs)

    reader.read = counted
    return reader, reads


def test_after_a_body_with_a_field_of_changing_type_the_next_few_are_read_without_inferring_first() -> None:
    """A producer whose `user` (a field the table lacks) is now a number, now text: the first
    body's read inferring the fields fails and it is read again ignoring them (two reads); the
    task's next FallbackMemory.SKIPPED bodies take one read each, and then inferring is tried
    again. Rows are the same as a fresh reader's, a body with no such field's too."""
    changing = b'{"id": 1, "user": 7}\n{"id": 2, "user": "anon", "msg": "m"}\n{"id": 3, "user": 8, "code": [1]}'
    steady = b'{"id": 4, "user": "bob"}\n{"id": 5}'

    def fresh(body: bytes) -> list[dict]:
        return BodyReader(parse_schema(TABLE, "_extra", []), TABLE, frozenset({"id"}), "_extra", [], False, None, True).rows_of(body)[0].to_pylist()

    reader, reads = counted_reader()
    for expected_reads in [2, *[1] * FallbackMemory.SKIPPED, 2]:
        reads.clear()
        assert reader.rows_of(changing)[0].to_pylist() == fresh(changing)
        assert len(reads) == expected_reads
    assert reader.rows_of(steady)[0].to_pylist() == fresh(steady)  # read from every line: the same


def test_fields_a_table_without_extra_fields_lacks_are_left_out_and_named_with_the_events_that_held_them() -> None:
    """A table as it is names every key it lacks, null or not (the full job lists the keys); an
    evolving one those with a value, and refuses a request whose new field could be a column."""
    plain = pa.schema([field for field in TABLE if field.name != "_extra"])

    def read(dropping: str, body: bytes) -> tuple[list[str], dict[str, set[int]]]:
        reader = BodyReader(parse_schema(plain, None, []), plain, frozenset({"id"}), None, [], False, None, dropping == DROP_KEYS, dropping)
        table, _events = reader.rows_of(body)
        return table.column_names, reader.dropped_rows

    columns = ["id", "msg", "n", "x", "ok"]
    # No null in the body: pyarrow's columns say which events hold each key.
    assert read(DROP_KEYS, b'{"id": 1, "trace": "t"}\n{"id": 2, "msg": "a", "trace": "u", "span": 3}\n{"id": 3}') == (
        columns, {"trace": {0, 1}, "span": {1}})
    # A null value: the key still counts (found where it is in the body), a null of a known
    # column or the text "null" in a string changes nothing.
    assert read(DROP_KEYS, b'{"id": 1, "user": null, "msg": "null"}\n{"id": 2, "n": null, "trace": "x"}\n{"id": 3, "user": "u"}') == (
        columns, {"user": {0, 2}, "trace": {1}})
    assert read(DROP_KEYS, b'{"id": 1, "msg": "a"}') == (columns, {})
    # A field of changing type (pyarrow cannot infer it): not read, only its keys looked for.
    assert read(DROP_KEYS, b'{"id": 1, "user": 7, "span": null}\n{"id": 2, "user": "anon"}\n{"id": 3, "msg": "m"}') == (
        columns, {"user": {0, 1}, "span": {0}})
    # Evolving: the dotted fields with a value only; a field that could become a column is the full job's.
    assert read(DROP_VALUES, b'{"id": 1, "http.method": null}\n{"id": 2, "http.method": "GET", "a.b": [1]}') == (
        columns, {"http.method": {1}, "a.b": {1}})
    with pytest.raises(Refused, match="lacks: 'trace'"):
        read(DROP_VALUES, b'{"id": 1, "trace": "t", "a.b": 1}')
    with pytest.raises(Refused, match="empty object"):  # the full job's inference leaves {} out, unless another request gives it keys
        read(DROP_VALUES, b'{"id": 1, "a.b": {}}')


def test_after_a_body_of_wide_events_the_next_few_are_read_without_inferring_the_fields_the_table_lacks() -> None:
    """Events with more fields the table lacks than extra_maps asks column by column (MANY_INFERRED:
    their maps come from where the keys and values are): the task's next FallbackMemory.SKIPPED
    bodies are read ignoring those fields (inferring their columns was for nothing: ~35% of such
    a body's reading), and then inferring is tried again. Rows are the same as a fresh reader's."""
    wide = "\n".join(json.dumps({"id": row, "msg": "m", **{f"f{n}": n * row if n % 2 else f"v{row}" for n in range(MANY_INFERRED + 4)}})
                     for row in range(5)).encode()

    def fresh(body: bytes) -> list[dict]:
        return BodyReader(parse_schema(TABLE, "_extra", []), TABLE, frozenset({"id"}), "_extra", [], False, None, True).rows_of(body)[0].to_pylist()

    reader, reads = counted_reader()
    for inferred in [True, *[False] * FallbackMemory.SKIPPED, True]:
        reads.clear()
        assert reader.rows_of(wide)[0].to_pylist() == fresh(wide)
        assert [read[1] for read in reads] == ["infer" if inferred else "ignore"]
    assert len(fresh(wide)[0]["_extra"]) == MANY_INFERRED + 4


_KEY_NAMES = ["msg", "status", "us", "a b", "é", 'q"t', "x:y", "ts"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(_KEY_NAMES), _ANY_VALUE | st.sampled_from(['"status":1', 'a": 2', "msg", 'x":{']), max_size=5),
                min_size=1, max_size=5),
       st.sampled_from([(",", ":"), (", ", ": "), (",", " :"), (",", ":\t")]), st.sets(st.sampled_from(_KEY_NAMES), min_size=1),
       st.sampled_from([(rb"[-0-9tf{[]", b"-0123456789tf{["), (b'"', b'"')]))
def test_keys_before_a_value_are_found_where_the_regex_finds_them(events: list[dict], separators: tuple[str, str], names: set[str],
                                                                  after: tuple[bytes, bytes]) -> None:
    """_KeysBefore.found (numpy, in compact JSON) gives what its regex's finditer gives: each of
    some names as a key before a value starting with some bytes, in lines written compact or
    with spaces, the names among keys and in string values (with quotes and colons of their
    own), ASCII or not, each key looked at alone or all at once; where the body is not compact it
    is the regex's answer."""
    text = b"\n".join(json.dumps(event, separators=separators, ensure_ascii=False).encode() for event in events)
    search = _KeysBefore(names, *after)
    expected = [(at.start(), at[1], at[0][-1]) for at in search.regex.finditer(text)]
    assert search.found(text, key_colons(text)) == expected
    search.ONE_BY_ONE = 0  # (as many keys of a name's length as wide events hold: all looked at at once)
    assert search.found(text, key_colons(text)) == expected


def test_after_a_body_whose_fields_the_table_lacks_are_objects_the_next_is_read_without_inferring_their_keys() -> None:
    """A Kubernetes shipper's events, each with a `pod` object the table lacks: once a task's body
    held such objects, its next is read with `pod` as an object whose keys are not inferred (one
    read, the fields outside the table ignored once msgspec found no other), its maps copied from
    the texts msgspec found. A body with another field the table lacks, or `pod` as text, is read inferring
    them as before (one read, or, where `pod` changed type, the reads of a field of changing type),
    and so are the task's next few bodies.
    Rows always those of a fresh reader."""
    def reads_of(reader: BodyReader) -> list[tuple[str, tuple[str, ...]]]:
        reads, read = [], reader.read

        def counted(body: bytes, unexpected: str, *args, objects: tuple[str, ...] = (), **kwargs) -> pa.Table:  # noqa: ANN002, ANN003
            reads.append((unexpected, objects))
            return read(body, unexpected, *args, objects=objects, **kwargs)

        reader.read = counted
        return reads

    def fresh(body: bytes) -> list[dict]:
        return BodyReader(parse_schema(TABLE, "_extra", []), TABLE, frozenset({"id"}), "_extra", [], False, None, True).rows_of(body)[0].to_pylist()

    pods = [b'{"id":%d,"msg":"m","pod":{"name":"web-%d","labels":{"app":"web"}}}' % (i, i) for i in range(5)]
    for sequence in [
        [(b"\n".join(pods), [("infer", ())]),
         (b"\n".join([*pods, b'{"id":9}', b'{"id":10,"pod":null}']), [("ignore", ("pod",))]),
         (b"\n".join([*pods, b'{"id":11,"trace":"t1"}']), [("infer", ())]),  # another field: msgspec refuses it before any read
         # ... and the next 33 bodies are inferred at once (the first as object_fields were forgotten, then the 32
         # objects_memory skips), then it is tried again.
         *[(b"\n".join(pods), [("infer", ())])] * 33, (b"\n".join(pods), [("ignore", ("pod",))])],
        [(b"\n".join(pods), [("infer", ())]),
         (b'{"id":13,"pod":{"a":1.50,"b":[{"c":"\\u00e9"}]}}', [("infer", ())])],  # an escape: inferred, as a key could be one
        [(b"\n".join(pods), [("infer", ())]),
         # text where the object was: of changing type, read as such
         (b"\n".join([*pods, b'{"id":12,"pod":"web-12"}']), [("ignore", ("pod",)), ("infer", ()), ("ignore", ())])],
    ]:
        reader = BodyReader(parse_schema(TABLE, "_extra", []), TABLE, frozenset({"id"}), "_extra", [], False, None, True)
        reads = reads_of(reader)
        for body, expected_reads in sequence:
            reads.clear()
            assert reader.rows_of(body)[0].to_pylist() == fresh(body)
            assert reads == expected_reads
    assert fresh(pods[0])[0]["_extra"] == [("pod", '{"name":"web-0","labels":{"app":"web"}}')]


_POD_OBJECT = st.dictionaries(st.sampled_from(["name", "a b", "é", "id"]),
                              st.none() | st.integers(-5, 5) | st.sampled_from(["x", "q\"", 0.5, 1e20]) | st.just({"k": [1]}), max_size=3)
_POD_VALUE = _POD_OBJECT | st.none() | st.sampled_from(["web", 1, 2.5, [1, "a"]])
_TRACE = st.sampled_from(["t1", 7])
# Mostly a pod's object in every event (a shipper's), now and then with a trace or a node; now and then anything.
_POD_EVENT = st.fixed_dictionaries({"pod": _POD_OBJECT}, optional={"trace": _TRACE}) | st.fixed_dictionaries(
    {"pod": _POD_OBJECT}, optional={"node": _POD_OBJECT}) | st.fixed_dictionaries({}, optional={"pod": _POD_VALUE, "node": _POD_VALUE, "trace": _TRACE})


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(_POD_EVENT, min_size=1, max_size=4), min_size=2, max_size=5))
def test_a_tasks_bodies_with_objects_the_table_lacks_read_one_after_another_are_read_as_each_alone(bodies: list[list[dict]]) -> None:
    """Bodies one after another in one task (so each may be read as its last body's objects say),
    their events' fields the table lacks objects, text, numbers, lists or nulls: each body's rows
    (or its refusal) are those a fresh reader gives it."""
    reader = BodyReader(parse_schema(TABLE, "_extra", []), TABLE, frozenset({"id"}), "_extra", [], False, None, True)
    reader.objects_memory = FallbackMemory(skipped=0)  # each body tried so after one whose fields were objects

    def rows(reading: BodyReader, body: bytes) -> object:
        try:
            return reading.rows_of(body)[0].to_pylist()
        except Refused as exc:
            return str(exc)

    for events in bodies:
        body = b"\n".join(json.dumps({"id": index, **event}, separators=(",", ":")).encode() for index, event in enumerate(events))
        fresh = BodyReader(parse_schema(TABLE, "_extra", []), TABLE, frozenset({"id"}), "_extra", [], False, None, True)
        assert rows(reader, body) == rows(fresh, body)


def test_a_body_after_one_read_in_groups_is_read_so_first_in_one_read_where_its_values_can_be_quoted() -> None:
    """BodyReader, the reads behind the test above: once a body held a number and text in a text
    column, the next such body is read so first, its numbers there written as the text the Spark
    job spells them as (quoted_texts): one pyarrow read, not a failed read of the whole body
    and of its number columns first; where that is unsure (the name's text twice in a line), one
    read per group. A body with no text column's name before a number after it costs one read and
    ends the groups' turn; so does one the groups cannot read (text in a number column, its name also a value in the line)."""
    reader, reads = counted_reader()
    def body(events: list[dict]) -> bytes:
        return b"\n".join(json.dumps(event).encode() for event in events)

    mixed = body([{"id": i, "msg": i if i % 2 else f"m{i}"} for i in range(8)])
    reader.rows_of(mixed)
    assert reader.split_last and len(reads) > 2
    expected = [str(i) if i % 2 else f"m{i}" for i in range(8)]
    reads.clear()
    table, events = reader.rows_of(mixed)
    assert len(reads) == 1 and reader.split_last and events == 8 and table.column("msg").to_pylist() == expected
    # "msg" twice in a line (here a value of a field the table lacks): that line is a group of its own.
    reads.clear()
    table, events = reader.rows_of(body([{"id": 1, "msg": 2.50, "tag": "msg"}, {"id": 2, "msg": 1e3}, {"id": 3, "msg": "t"}]))
    assert len(reads) == 2 and table.column("msg").to_pylist() == ["2.5", "1000.0", "t"]
    assert table.column("_extra").to_pylist() == [[("tag", "msg")], None, None]
    # Booleans, objects and lists there too: copied as their text, in the same one read.
    reads.clear()
    table, events = reader.rows_of(body([{"id": 1, "msg": {"a": [1.50, None]}}, {"id": 2, "msg": True}, {"id": 3, "msg": 4}, {"id": 4, "msg": "t"}]))
    assert len(reads) == 1 and events == 4 and table.column("msg").to_pylist() == ['{"a":[1.5,null]}', "true", "4", "t"]
    # And text in a number column amid its numbers: a plain number's text as its number, other text
    # NULL (and so named). Such text is searched for once a read found some (a second read), and
    # in the next body at once (one read).
    plain = [{"id": 10 + i, "n": i} for i in range(4)]  # (text in a number column in most lines: read_numbers's, as before)
    texts = body([{"id": 1, "n": 5, "x": "2.50"}, {"id": 2, "n": "7", "msg": 3}, {"id": 3, "n": "n/a", "x": 1}, *plain])
    for expected_reads in (2, 1):
        reads.clear()
        table, events = reader.rows_of(texts)
        assert len(reads) == expected_reads and reader.quoted_last
        assert table.column("n").to_pylist() == [5, 7, None, 0, 1, 2, 3] and table.column("x").to_pylist() == [2.5, None, 1.0, *[None] * 4]
        assert table.column("msg").to_pylist() == [None, "3", *[None] * 5] and reader.nulled_rows == {"n": {2}}
    # Only the lines where a text column's name comes before a number are parsed in Python; one
    # that spells the name with escapes is found by pyarrow's read instead, and read alone.
    escaped = mixed + b'\n{"id": 9, "m\\u0073g": 9}'
    table, events = reader.rows_of(escaped)
    assert events == 9 and table.column("msg").to_pylist() == [*expected, "9"]
    reader.rows_of(mixed)
    reads.clear()
    reader.rows_of(body([{"id": 100, "msg": "plain", "n": 3}]))
    assert len(reads) == 1 and not reader.split_last
    reader.rows_of(mixed)
    reads.clear()
    table, events = reader.rows_of(body([{"id": 300, "msg": 7}, {"id": 301, "msg": "u"}, {"id": 302, "n": "slow", "tag": "n"}]))
    assert len(reads) > 2 and not reader.split_last
    assert table.column("msg").to_pylist() == ["7", "u", None] and table.column("n").to_pylist() == [None, None, None]


def test_a_text_column_holding_integers_in_most_events_has_those_read_together_as_integers() -> None:
    """read_split's `together`: where a text column holds a number in most lines (a status column
    created as text), the lines with nothing else odd are read in one read, that column as
    integers spelled as their digits, without Python's json; the others (its text, an object in
    another text column) apart; the rows as the events' order has them. A fraction there costs
    the body a read without it; one the search finds (2.50) is read apart."""
    reader, reads = counted_reader()
    values = [200, 404, "200", -0, {"a": 1}, 2**63 - 1, None, "n/a", 201, 500]
    body = b"\n".join(b'{"id": %d, "msg": %s}' % (i, json.dumps(value).encode()) for i, value in enumerate(values))
    expected = ["200", "404", "200", "0", '{"a":1}', str(2**63 - 1), None, "n/a", "201", "500"]
    reader.rows_of(body)
    reads.clear()
    table, events = reader.rows_of(body)
    assert events == 10 and table.column("msg").to_pylist() == expected and table.column("id").to_pylist() == list(range(10))
    assert len(reads) == 2 and all(b"n/a" not in args[0] for args in reads[:1])  # the integers' lines, then the others
    reads.clear()
    table, _events = reader.rows_of(body.replace(b'"msg": 201', b'"msg": 2.50'))
    assert len(reads) == 2 and b"2.5" in reads[1][0] and table.column("msg").to_pylist() == [*expected[:8], "2.5", "500"]
    reads.clear()  # (a fraction whose key the search misses, spelled with an escape: the integers' read refuses it, and so do the others)
    with pytest.raises(Refused):
        reader.rows_of(body.replace(b'"msg": "n/a"', b'"msg": 7').replace(b'"msg": 500', b'"m\\u0073g": 2.50'))
    assert reads[0][0].count(b"\n") == 7 and b"u0073g" in reads[0][0]  # the integers' read first (8 lines)


@pytest.mark.parametrize(("line", "names", "written"), [
    (b'{"id": 1, "msg": 12}', ["msg"], b'{"id": 1, "msg": "12"}'),
    (b'{"msg" : -0, "id": 1}', ["msg"], b'{"msg" : "0", "id": 1}'),
    (b'{"id": 1, "msg": 1.50, "host": 1e3}', ["msg", "host"], b'{"id": 1, "msg": "1.5", "host": "1000.0"}'),
    (b'{"id": 1, "msg": 0.0001}', ["msg"], b'{"id": 1, "msg": "1.0E-4"}'),
    (b'{"id": 1, "msg": 18446744073709551616}', ["msg"], b'{"id": 1, "msg": "18446744073709551616"}'),
    (b'{"id": 1, "msg": 1e16}', ["msg"], None),  # Java's digits unsure from 1e16 on
    (b'{"id": 1, "msg": "x", "msg": 5}', ["msg"], None),  # a key twice
    (b'{"id": 1, "n": {"msg": 4}, "msg": 5}', ["msg"], None),  # a nested field of the name
    (b'{"id": 1, "tag": "msg", "msg": 5}', ["msg"], None),  # the name's text as a value
    (b'{"id": 1, "n": {"msg": 4}, "m\\u0073g": 5}', ["msg"], None),  # the key spelled with escapes: the nested one found
    # Booleans, objects and lists: copied as Jackson writes them (compact, numbers as Java spells them, keys twice kept).
    (b'{"id": 1, "msg": true}', ["msg"], b'{"id": 1, "msg": "true"}'),
    (b'{"msg":false,"id": 1}', ["msg"], b'{"msg":"false","id": 1}'),
    (b'{"id": 1, "msg": { "a" : 1.50, "b": [1e3, "x", null], "c": {} }, "n": 2}', ["msg"],
     b'{"id": 1, "msg": "{\\"a\\":1.5,\\"b\\":[1000.0,\\"x\\",null],\\"c\\":{}}", "n": 2}'),
    (b'{"id": 1, "msg": [1, "\xc3\xa9", {"q": "a\\"b\\n"}]}', ["msg"], b'{"id": 1, "msg": "[1,\\"\\u00e9\\",{\\"q\\":\\"a\\\\\\"b\\\\n\\"}]"}'),
    (b'{"id": 1, "msg": ["\xf0\x9f\x98\x80"]}', ["msg"], b'{"id": 1, "msg": "[\\"\\\\uD83D\\\\uDE00\\"]"}'),  # as UTF-16 escapes, Jackson's
    (b'{"id": 1, "msg": {"k": 1, "k": 2}}', ["msg"], b'{"id": 1, "msg": "{\\"k\\":1,\\"k\\":2}"}'),
    (b'{"id": 1, "msg": [1e400]}', ["msg"], None),  # a number no double holds: unsure
    (b'{"id": 1, "msg": ["\\u0001"]}', ["msg"], None),  # a control character Jackson escapes as \u0001: unsure
    (b'{"id": 1, "msg": {"msg": 1}}', ["msg"], None),  # the name's text twice
    (b'{"id": 1, "msg": [2], "host": 7}', ["msg", "host"], b'{"id": 1, "msg": "[2]", "host": "7"}'),
    (b'{"id": 1, "tag": "msg", "m\\u0073g": true}', ["msg"], None),  # the name's text only as a value (its key spelled with escapes)
])
def test_values_in_a_text_column_are_quoted_as_the_spark_job_copies_them_where_the_line_says_so_surely(
        line: bytes, names: list[str], written: bytes | None) -> None:
    event = exact_numbers(json_event(line), line, names)
    assert quoted_texts(line, event, names) == written


@pytest.mark.parametrize(("line", "numbers", "written"), [
    (b'{"id": 1, "status": "200"}', {"status": 200}, b'{"id": 1, "status": 200}'),
    (b'{"status" : "n/a", "id": 1}', {"status": None}, b'{"status" : null, "id": 1}'),
    (b'{"id": 1, "tag": "status", "status": "200"}', {"status": 200}, None),  # the name's text as a value too
    (b'{"id": 1, "tag": "status", "st\\u0061tus": "200"}', {"status": 200}, None),  # only as a value (its key spelled with escapes)
])
def test_text_in_a_number_column_is_written_as_its_number_or_null_where_the_line_says_so_surely(
        line: bytes, numbers: dict, written: bytes | None) -> None:
    assert quoted_texts(line, json_event(line), [], numbers) == written


def test_booleans_sent_as_text_are_read_as_the_spark_job_converts_them_and_other_spellings_are_its(tmp_path) -> None:  # noqa: ANN001
    """text_nulls: a boolean column's values sent as text are Spark's words for true and false in
    any case ("true", "NO", "Y", "1"), other printable ASCII text NULL, as the Spark job's
    conversion makes them, with numbers sent as text beside them; text a trim may change
    (" true"), other than ASCII, a number with a fraction, or text and booleans in one column leave
    the request to the Spark job; the task's next body is read so first."""
    parsing = parse_schema(TABLE, "_extra", [])
    append = _appender(str(tmp_path / "batch"), pafs.LocalFileSystem(), parsing, TABLE, frozenset({"id"}), "_extra", [], by_request=True,
                       text_nulls=True)
    bodies = [
        b'{"id": 1, "ok": "true"}\n{"id": 2, "ok": "NO"}\n{"id": 3, "ok": "maybe"}\n{"id": 4, "ok": ""}\n{"id": 5}',
        b'{"id": 6, "ok": "Y", "n": "12"}',  # the next body read as the last: text, and numbers as text too
        b'{"id": 7, "ok": true}',  # booleans again
        b'{"id": 8, "ok": " true"}',
        b'{"id": 9, "ok": "vrai\xc3\xa9"}',
        b'{"id": 10, "ok": 1.0}',
        b'{"id": 11, "ok": "1"}\n{"id": 12, "ok": false}',
        b'{"id": 13, "ok": "F"}',
    ]
    batch = pa.record_batch({
        "receipt": [f"r{i}" for i in range(len(bodies))], "body": pa.array(bodies, pa.large_binary()),
        "seq": pa.array([index * LINE_SLOTS for index in range(len(bodies))], pa.int64()),
    })
    (answer,) = [row for out in append(iter([batch])) for row in out.to_pylist()]
    assert answer["refused"] is None and json.loads(answer["rejected"]) == [LINE_SLOTS * i for i in (3, 4, 5, 6)]
    assert json.loads(answer["counts"]) == {"r0": 5, "r1": 1, "r2": 1, "r7": 1}
    rows = [{k: v for k, v in row.items() if v is not None} for row in pq.read_table(answer["path"]).to_pylist()]
    assert rows == [{"id": 1, "ok": True}, {"id": 2, "ok": False}, {"id": 3}, {"id": 4}, {"id": 5}, {"id": 6, "n": 12, "ok": True},
                    {"id": 7, "ok": True}, {"id": 13, "ok": False}]
    assert json.loads(answer["nulled"]) == {"r0": [["ok"], 2]}


def test_booleans_sent_as_one_and_zero_are_read_as_the_spark_job_converts_them_and_other_numbers_are_null(tmp_path) -> None:  # noqa: ANN001
    """text_nulls: a boolean column's values sent as JSON integers are true for 1 and false for 0
    (and -0), as the Spark job reads a number's digits; any other integer is NULL in an optional
    column, named in the answer; a number with a fraction, numbers beside booleans or text in one
    column of one request, or another integer in a required boolean column leave the request to
    the Spark job; the task's next body is read as the last was first."""
    schema = Schema(NestedField(1, "id", LongType(), required=True), NestedField(2, "ok", BooleanType()),
                    NestedField(3, "sure", BooleanType(), required=False), NestedField(4, "must", BooleanType(), required=True)).as_arrow()
    parsing = parse_schema(schema, None, [])
    append = _appender(str(tmp_path / "batch"), pafs.LocalFileSystem(), parsing, schema, frozenset({"id", "must"}), None, [], by_request=True,
                       text_nulls=True)
    bodies = [
        b'{"id": 1, "ok": 1, "must": 1}\n{"id": 2, "ok": 0, "must": 0}\n{"id": 3, "ok": 2, "must": 1}\n{"id": 4, "ok": -0, "must": -0}\n'
        b'{"id": 5, "must": 1, "sure": -1}',
        b'{"id": 6, "ok": 1, "must": true}',  # the next body read as the last: numbers here, a boolean there
        b'{"id": 7, "ok": true, "must": false}',  # booleans again
        b'{"id": 8, "ok": 1.0, "must": true}',
        b'{"id": 9, "ok": 1, "must": true}\n{"id": 10, "ok": false, "must": true}',
        b'{"id": 11, "ok": "yes", "must": true}\n{"id": 12, "ok": 0, "must": true}',
        b'{"id": 13, "ok": 1, "must": 2}',
    ]
    batch = pa.record_batch({
        "receipt": [f"r{i}" for i in range(len(bodies))], "body": pa.array(bodies, pa.large_binary()),
        "seq": pa.array([index * LINE_SLOTS for index in range(len(bodies))], pa.int64()),
    })
    (answer,) = [row for out in append(iter([batch])) for row in out.to_pylist()]
    assert answer["refused"] is None and json.loads(answer["rejected"]) == [LINE_SLOTS * i for i in (3, 4, 5, 6)]
    assert json.loads(answer["counts"]) == {"r0": 5, "r1": 1, "r2": 1}
    rows = [{k: v for k, v in row.items() if v is not None} for row in pq.read_table(answer["path"]).to_pylist()]
    assert rows == [{"id": 1, "ok": True, "must": True}, {"id": 2, "ok": False, "must": False}, {"id": 3, "must": True},
                    {"id": 4, "ok": False, "must": False}, {"id": 5, "must": True},
                    {"id": 6, "ok": True, "must": True}, {"id": 7, "ok": True, "must": False}]
    assert json.loads(answer["nulled"]) == {"r0": [["ok", "sure"], 2]}


def test_a_body_that_shows_its_text_columns_numbers_one_read_at_a_time_is_read_a_bounded_number_of_times(tmp_path) -> None:  # noqa: ANN001
    """Each read of a body finds one more text column holding a number: past REREAD_TIMES + 1
    reads its events are read in groups by the columns where they hold numbers (one read each),
    past MAX_SPLITS groups alone, and past MAX_MISTYPED of them (or REREAD_TIMES its bytes over)
    the request is the Spark job's, so a body built so costs a task a bounded share."""
    schema = Schema(NestedField(1, "id", LongType(), required=True),
                    *(NestedField(2 + i, f"s{i}", StringType()) for i in range(6))).as_arrow()
    parsing = parse_schema(schema, None, [])
    append = _appender(str(tmp_path / "batch"), pafs.LocalFileSystem(), parsing, schema, frozenset({"id"}), None, [], by_request=True,
                       text_nulls=True)

    def body(columns: int) -> bytes:  # numbers in s0 ... s{columns - 1}, text in the others: a read finds one such column
        return b"\n".join(json.dumps({"id": i, **{f"s{j}": (j if j < columns else f"t{j}") for j in range(6)}}).encode() for i in range(3))

    # Each event with numbers in other columns than the others (event i: those of the bits of i + 1),
    # its text the next column's name: a name twice in a line, whose numbers quoted_numbers leaves.
    scattered = b"\n".join(json.dumps({"id": i, **{f"s{j}": (j if (i + 1) >> j & 1 else f"s{(j + 1) % 6}") for j in range(6)}}).encode()
                            for i in range(MAX_MISTYPED + 1))
    bodies = [scattered, body(6), body(3)]
    batch = pa.record_batch({"receipt": ["scattered", "six", "three"], "body": pa.array(bodies, pa.large_binary()),
                             "seq": pa.array([0, LINE_SLOTS, 2 * LINE_SLOTS], pa.int64())})
    (answer,) = [row for out in append(iter([batch])) for row in out.to_pylist()]
    assert json.loads(answer["counts"]) == {"six": 3, "three": 3} and json.loads(answer["rejected"]) == [0]
    rows = pq.read_table(answer["path"]).to_pylist()
    assert [row["s2"] for row in rows] == ["2"] * 6 and [row["s5"] for row in rows] == ["5"] * 3 + ["t5"] * 3


@pytest.mark.parametrize("text", ["slow", "", " ", "n/a", "-", "😀", "true"])
def test_may_read_as_number_says_no_only_for_text_without_a_digit_or_a_specials_word(text: str) -> None:
    assert not may_read_as_number(text)
    for number in ("1", " 12 ", "1e3", "NaN", "-inf", "Infinity", "0x10", "1d", "\u0661", "\uff11", text + "7"):
        assert may_read_as_number(number), number


def test_text_in_number_columns_spread_over_a_body_leaves_it_to_the_spark_job_past_three_reads_of_its_bytes(tmp_path) -> None:  # noqa: ANN001
    """Each event with such text that read_split cannot write into its line (the column's name
    also a value there) stops pyarrow, and the rest of the body is read again: a body whose text
    events would have it read more than three times over goes to the Spark job."""
    parsing = parse_schema(TABLE, "_extra", [])
    append = _appender(str(tmp_path / "batch"), pafs.LocalFileSystem(), parsing, TABLE, frozenset({"id"}), "_extra", [], by_request=True,
                       text_nulls=True)

    def body(texts: set[int]) -> bytes:
        return b"\n".join(b'{"id": %d, "x": %s}' % (i, b'"slow", "note": "x"' if i in texts else b"1.5") for i in range(100))

    bodies = [body({80, 90}), body(set(range(10, 100, 10)))]  # read ~1.3 times over; ~5.4 times over
    batch = pa.record_batch({"receipt": ["late", "spread"], "body": pa.array(bodies, pa.large_binary()),
                             "seq": pa.array([0, LINE_SLOTS], pa.int64())})
    (answer,) = [row for out in append(iter([batch])) for row in out.to_pylist()]
    assert json.loads(answer["counts"]) == {"late": 100} and json.loads(answer["rejected"]) == [LINE_SLOTS]
    assert [row["x"] for row in pq.read_table(answer["path"]).to_pylist() if row["id"] in (79, 80, 90)] == [1.5, None, None]


def test_a_task_for_several_sinks_reads_each_body_once_for_the_sinks_that_read_it_alike(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    # Two sinks into tables alike, their routes apart (a where each), and one into a table of its
    # own: a body is read twice, not three times, and each sink gets the rows its where keeps,
    # its files and counts answered under its place among the sinks. A request one sink's
    # reading refuses refuses the task (all or nothing: the job deletes every sink's files).
    from service.pipelines.spec import Processor
    from spark_jobs.direct_append import BodyReader, _append, sink_arguments
    from spark_jobs.plain_processors import plan

    narrow = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("n", pa.int32())])
    sinks = [sink_arguments(str(tmp_path / name), pafs.LocalFileSystem(), parse_schema(schema, extra), schema, frozenset({"id"}), extra,
                            processors=plan([Processor(where=where)], schema, extra))
             for name, schema, extra, where in (("all", TABLE, "_extra", "id > 0"), ("big", TABLE, "_extra", "n > 10"),
                                                ("narrow", narrow, None, "n IS NOT NULL"))]
    reads = []
    read_rows = BodyReader.read_rows
    monkeypatch.setattr(BodyReader, "read_rows", lambda self, body: reads.append(body) or read_rows(self, body))
    bodies = [b'{"id": 1, "n": 5}\n{"id": 2, "n": 50}', b'{"id": 3}']

    def run(bodies: list[bytes]) -> list[dict]:
        batch = pa.record_batch({"receipt": [f"r{i}" for i in range(len(bodies))], "body": pa.array(bodies, pa.large_binary()),
                                 "seq": pa.array([i * LINE_SLOTS for i in range(len(bodies))], pa.int64())})
        return [row for out in _append(sinks, None, False, iter([batch])) for row in out.to_pylist()]

    answers = run(bodies)
    assert reads == [b"\n".join(bodies)] * 2  # (small requests are read together: test_small_requests_are_read_together...)
    assert [(row["sink"], json.loads(row["counts"])) for row in answers] == [(0, {"r0": 2, "r1": 1}), (1, {"r0": 1, "r1": 0}), (2, {"r0": 2, "r1": 0})]
    assert [sorted(pq.read_table(row["path"]).column("id").to_pylist()) for row in answers] == [[1, 2, 3], [2], [1, 2]]
    assert pq.read_table(answers[2]["path"]).schema == narrow
    (refused,) = run([bodies[0], b'{"id": 4, "msg": "m"}'])  # a field the narrow table lacks, and no extra_fields there
    assert "unexpected field" in refused["refused"] and refused["path"] is None


def test_small_requests_are_read_together_and_each_answered_as_if_read_alone(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """Consecutive small bodies are read as one body (a read costs a task ~0.36 ms whatever it
    holds) and split again at their lines: each request's rows, count and NULLed columns are what
    reading it alone gives. Where the bodies together cannot be read (a request the short way
    refuses), each is read alone: the refused one is left to the Spark job, the others written."""
    from spark_jobs import direct_append
    from spark_jobs.direct_append import BodyReader

    parsing = parse_schema(TABLE, "_extra", [])
    reads = []
    read_rows = BodyReader.read_rows
    monkeypatch.setattr(BodyReader, "read_rows", lambda self, body: reads.append(body) or read_rows(self, body))

    def run(bodies: list[bytes], name: str) -> tuple[dict, list[dict]]:
        append = _appender(str(tmp_path / name), pafs.LocalFileSystem(), parsing, TABLE, frozenset({"id"}), "_extra", [], by_request=True,
                           text_nulls=True)
        batch = pa.record_batch({"receipt": [f"r{i}" for i in range(len(bodies))], "body": pa.array(bodies, pa.large_binary()),
                                 "seq": pa.array([i * LINE_SLOTS for i in range(len(bodies))], pa.int64())})
        (answer,) = [row for out in append(iter([batch])) for row in out.to_pylist()]
        return answer, pq.read_table(answer["path"]).to_pylist()

    bodies = [
        b'{"id": 1, "x": "slow", "msg": "a"}\n{"id": 2, "trace": "t1"}',  # a text NULLed in a number column; a field the table lacks
        b'{"id": 3}\n',
        b'{"id": 4, "n": "n/a"}\n\n{"id": 5, "n": "?", "x": 2.5}',  # two NULLed in one request, a blank line
        b'{"id": 6, "msg": 7, "ok": true}',  # a number in a text column
    ]
    together, rows = run(bodies, "together")
    assert reads == [b"\n".join(bodies)]  # one read for the four
    assert json.loads(together["counts"]) == {"r0": 2, "r1": 1, "r2": 2, "r3": 1}
    assert json.loads(together["nulled"]) == {"r0": [["x"], 1], "r2": [["n"], 2]}
    reads.clear()
    monkeypatch.setattr(direct_append, "SMALL_BODY", 0)  # every body read alone, as before
    alone, rows_alone = run(bodies, "alone")
    assert len(reads) == len(bodies)
    assert rows == rows_alone and [row["id"] for row in rows] == [1, 2, 3, 4, 5, 6]
    assert {key: together[key] for key in ("counts", "nulled", "rejected")} == {key: alone[key] for key in ("counts", "nulled", "rejected")}

    monkeypatch.setattr(direct_append, "SMALL_BODY", 64 << 10)
    reads.clear()
    refused = [bodies[0], b'{"id": "seven"}', bodies[3]]  # a required column's text: the Spark job's
    answer, rows = run(refused, "refused")
    assert reads == [b"\n".join(refused), *refused]  # together, then each alone
    assert json.loads(answer["rejected"]) == [LINE_SLOTS] and json.loads(answer["counts"]) == {"r0": 2, "r2": 1}
    assert [row["id"] for row in rows] == [1, 2, 6]
