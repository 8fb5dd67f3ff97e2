"""OTLP log records as the `otel_logs` table's own columns, from the api to Spark's tasks.

An OTLP export the api reads column by column (service/api/otlp_columns.py) is buffered as one
Arrow IPC stream of its rows in the built-in schema (ROWS: times as timestamps, attributes as maps
in key order), not as NDJSON lines: the api does not write the lines, and a short-way task whose
table takes those columns as they are writes them as Parquet without parsing JSON again
(direct_append.py). Wherever lines are needed (the full Spark job, the DLQ, a table whose columns
differ, processors) `lines` writes them from the columns: the lines the api would have written,
but for each map's keys, in key order (which no row depends on: every map is written in key order).

A buffered body is one or the other: an IPC stream starts with its continuation marker (four 0xFF
bytes), which UTF-8 text never holds.
"""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.compute as pc

# No pyspark here: the api imports this module (direct_append.py has Spark's tasks take it by value).
IPC_MARKER = b"\xff\xff\xff\xff"
TEXT_MAP = pa.map_(pa.string(), pa.string())
ROWS = pa.schema([
    ("timestamp", pa.timestamp("us", tz="UTC")), ("observed_timestamp", pa.timestamp("us", tz="UTC")), ("severity_number", pa.int32()),
    ("severity_text", pa.string()), ("body", pa.string()), ("attributes", TEXT_MAP), ("resource_attributes", TEXT_MAP),
    ("scope_name", pa.string()), ("scope_version", pa.string()), ("trace_id", pa.string()), ("span_id", pa.string()),
    ("flags", pa.int64()), ("event_name", pa.string()),
])
_NEEDS_ESCAPE = re.compile(rb'["\\\x00-\x1f]')
# orjson's escapes: the short ones, and \u00XX for the other control characters.
_LONG_ESCAPE = r"[\x00-\x07\x0b\x0e-\x1f]"
_SHORT_ESCAPES = (("\\", "\\\\"), ('"', '\\"'), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t"), ("\b", "\\b"), ("\f", "\\f"))


def is_rows(body: bytes) -> bool:
    """Whether a buffered body is an IPC stream of ROWS (else NDJSON lines)."""
    return body[:4] == IPC_MARKER


def to_ipc(rows: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rows.schema) as writer:
        writer.write_table(rows)
    return sink.getvalue().to_pybytes()


def from_ipc(body: bytes) -> pa.Table:
    return pa.ipc.open_stream(body).read_all()


def as_lines(body: bytes) -> bytes:
    """A buffered body as NDJSON lines, whichever it is."""
    return lines(from_ipc(body)) if is_rows(body) else body


def lines(rows: pa.Table) -> bytes:
    """The rows' NDJSON lines, each field as the api's per-record way writes it (absent where null)."""
    fields = [
        field('{"timestamp":"', iso(rows.column("timestamp")), 'Z"'),
        field(',"observed_timestamp":"', iso(rows.column("observed_timestamp")), 'Z"'),
        field(',"severity_number":', pc.cast(rows.column("severity_number"), pa.string())),
        field(',"severity_text":"', escaped(rows.column("severity_text")), '"'),
        field(',"body":"', escaped(rows.column("body")), '"'),
        field(',"attributes":', map_texts(rows.column("attributes"))),
        field(',"resource_attributes":', map_texts(rows.column("resource_attributes"))),
        field(',"scope_name":"', escaped(rows.column("scope_name")), '"'),
        field(',"scope_version":"', escaped(rows.column("scope_version")), '"'),
        field(',"trace_id":"', rows.column("trace_id"), '"'),
        field(',"span_id":"', rows.column("span_id"), '"'),
        field(',"flags":', pc.cast(rows.column("flags"), pa.string())),
        field(',"event_name":"', escaped(rows.column("event_name")), '"'),
    ]
    line = pc.binary_join_element_wise(*fields, "}", "", null_handling="replace", null_replacement="")
    line = line.combine_chunks() if isinstance(line, pa.ChunkedArray) else line
    joined = pc.binary_join(pa.ListArray.from_arrays(pa.array([0, len(line)], pa.int32()), line), "\n")
    return joined.cast(pa.binary())[0].as_py()


def field(name: str, text: pa.Array, after: str = "") -> pa.Array:
    """`name`, `text` and `after`; null (left out of the line) where `text` is null."""
    return pc.binary_join_element_wise(name, text, after, "")


def iso(times: pa.Array) -> pa.Array:
    """Each time as "2025-11-24T16:00:00.123456" (UTC; the caller puts in the Z), null stays null."""
    return pc.binary_replace_slice(pc.cast(pc.cast(times, pa.timestamp("us")), pa.string()), 10, 11, "T")


def escaped(values: pa.Array) -> pa.Array:
    """Each string as orjson writes it between its quotes."""
    values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    data = values.buffers()[2]
    if data is None or not _NEEDS_ESCAPE.search(data):  # the strings' bytes at once (those of a slice's neighbours too)
        return values
    if pc.any(pc.match_substring_regex(values, _LONG_ESCAPE)).as_py():  # rare: orjson spells each
        import orjson

        return pa.array([None if value is None else orjson.dumps(value).decode()[1:-1] for value in values.to_pylist()], pa.string())
    for plain, escaped_text in _SHORT_ESCAPES:
        values = pc.replace_substring(values, plain, escaped_text)
    return values


def object_texts(offsets: pa.Array, keys: pa.Array, texts: pa.Array) -> pa.Array:
    """Each owner's pairs (its `offsets` into `keys` and `texts`) as the text of a JSON object."""
    pairs = pc.binary_join_element_wise('"', escaped(keys), '":"', escaped(texts), '"', "")
    inner = pc.binary_join(pa.ListArray.from_arrays(offsets, pairs), ",")
    return pc.binary_join_element_wise("{", inner, "}", "")


def map_texts(maps: pa.Array) -> pa.Array:
    """Each map of strings as a JSON object's text; null stays null."""
    maps = maps.combine_chunks() if isinstance(maps, pa.ChunkedArray) else maps
    if maps.offset:
        maps = pa.concat_arrays([maps])  # offsets from 0
    texts = object_texts(maps.offsets, maps.keys, maps.items)
    return pc.if_else(maps.is_valid(), texts, pa.scalar(None, pa.string())) if maps.null_count else texts


def key_ordered_maps(offsets: pa.Array, keys: pa.Array, texts: pa.Array) -> pa.MapArray | None:
    """Maps of strings, each owner's pairs (`offsets` into `keys` and `texts`) in key order, as the
    Spark job writes every map (and the short way too); None where an owner holds a key twice."""
    owners = pc.list_parent_indices(pa.ListArray.from_arrays(offsets, keys))
    order = pc.sort_indices(pa.table({"owner": owners, "key": keys}), sort_keys=[("owner", "ascending"), ("key", "ascending")])
    keys = keys.take(order)
    if len(keys) > 1:  # a key twice in one owner: side by side once sorted
        owners = owners.take(order)
        if pc.any(pc.and_(pc.equal(owners[1:], owners[:-1]), pc.equal(keys[1:], keys[:-1]))).as_py():
            return None
    return pa.MapArray.from_arrays(offsets, keys, texts.take(order))
