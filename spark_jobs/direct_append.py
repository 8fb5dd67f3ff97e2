"""The short way for the commonest batch: events that fit their table as they are.

A pipeline with no processors (or plain ones: plain_processors.py) or routes, one static sink
into an existing table that only appends, whose columns are strings, integers, floating point
numbers, booleans, decimals, binary, timestamps, dates, maps of strings to strings and lists and
structs of the first four (and its extra_fields map), partitioned by nothing or by identity, year,
month, day, hour, bucket (of integers, strings, binary, dates and times: `buckets`) or truncate
(of strings, binary and integers): its events need no inference and no expressions. An object with a
key its struct column lacks refuses its request (the Spark job names the key as dropped). For such a batch each Spark
task hands its requests' bodies to pyarrow in a Python worker (`mapInArrow`), which parses the
NDJSON with the table's schema and writes one Parquet file per partition value: about a tenth of
the CPU of parsing with Spark's JSON functions and converting column by column. The tasks read
the bodies from the input stream themselves when given its entries (stream_bodies.py), so that
none crosses Spark's JVM.

Timestamps and dates are read as the README's conversion rules read them (coerce.py), for the
forms both ways surely read alike (`times`): ISO 8601 as `2024-05-01T10:11:12.123Z` spells it (T
or a space, up to nine fractional digits, those past six dropped as Spark's cast drops them, Z or
an offset to the minute; no offset for a timestamp without zone; a date alone) from 1900 on, and
epoch milliseconds (days for a date columns) as JSON integers. Any other spelling, a day that
does not exist or a column sent both ways in one request refuses the batch.

Decimals are parsed by pyarrow from JSON numbers and text alike, exactly, as the Spark job reads
them (coerce.coerce's `exact`: a JSON number's digits, not a double's). A value with more fractional
digits than the column's scale (which the Spark job rounds half up) or more digits than its
precision (its NULL) refuses the request. Binary is read from base64 text spelled canonically
(`binaries`); any other spelling, which the Spark job's decoder reads by rules of its own (no
padding, line breaks), refuses it.

A map of strings (the shippers' labels and attributes) is inferred by pyarrow as a struct, whose
fields give each event's entries (`_struct_maps`), written in key order as the Spark job writes
every map it reads from an event (coerce.key_ordered); where a struct may not say what an object
holds (a JSON null in the line of an event lacking one of its keys) those lines are read again by
orjson. A value other than an object of strings (a null, a number, a nested object) refuses the
batch. A map of strings inside an object column (a Kubernetes object's labels) is left out of the
parse and inferred the same way, within its object (`nested_text_maps`).

Fields the table lacks go into its extra_fields map, as the Spark job puts them there: pyarrow
infers them as columns of their own, which says which events have any (a few, typically), and
most often what each holds (strings, numbers and flags from their columns; an object or a list
copied from the body's bytes where that copy is sure to be Spark's: `_extras_by_column`; where a
task's last body held only objects there, their keys are not inferred again: `read_objects`). Where
each event may have one (more than MANY_INFERRED such columns, one in every event, or types that
change so pyarrow cannot infer them), numpy finds every event's keys and values in the body
(`_JsonLayout.unknown_fields`) and each value's text is copied from it where sure; elsewhere those
events' lines are read again, by Python's json, for each such field's text, spelled as
Spark's JSON functions spell it (`extra_text`). A value whose spelling is not certain (a float at
or beyond 1e16, where Java 17's Double.toString is not the shortest; a control character or an
unpaired surrogate in a string) refuses the batch. A table without the map: any such field refuses.

Otherwise it is all or nothing per request (a body). Whatever the Spark job would treat as
anything but a plain row (a value of another type, a number out of range, a duplicate key, a
missing required field, an event with no field of the table) makes pyarrow refuse the request,
or is found after the parse. Asked to (`by_request`: appends), this way writes the other
requests and names the refused ones, which the caller runs through the Spark job, which decides
what each of their events becomes exactly as it always does (a request's rows never depend on
another request's); otherwise (row changes, whose place in the batch orders them) the files
written are deleted and the Spark job runs the whole batch. So this path changes how fast,
never what.
"""

from __future__ import annotations

import bisect
import collections
import io
import itertools
import json
import math
import operator
import re
import sys
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from decimal import Decimal
from functools import cache, lru_cache, reduce
from typing import NamedTuple

import msgspec
import numpy as np
import pyarrow as pa
from pyspark import cloudpickle
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from spark_jobs import otlp_rows
from spark_jobs.buckets import buckets
from spark_jobs.columns import INTERNAL, LINE_SLOTS, OP, RECEIPT, SEQ, column_name_ok
from spark_jobs.contract import BUCKETS_METADATA
from spark_jobs.events import has_set_aside
from spark_jobs.files import _path, conform, freeze_once, rows_per_file, write_runs
from spark_jobs.otlp_rows import ROWS, from_ipc, is_rows
from spark_jobs.otlp_rows import lines as rows_lines
from spark_jobs.plain_processors import BOOLEAN_TEXT, TRUE_TEXTS, dropped, is_text_map, negative_zero, nulled, renamed
from spark_jobs.plain_processors import apply as apply_processors
from spark_jobs.stream_bodies import UNREACHABLE, StreamEntries, read_bodies
from spark_jobs.targets import MAX_DROPPED_NAMES
from spark_jobs.task_code import bound

cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(otlp_rows)  # its functions run in the tasks too; the api imports it without pyspark

# Types whose JSON reading pyarrow and the Spark job agree on exactly; anything else: the Spark job.
_PLAIN_TYPES = (pa.types.is_string, pa.types.is_large_string, pa.types.is_int64, pa.types.is_int32,
                pa.types.is_float64, pa.types.is_float32, pa.types.is_boolean)

TEXT_MAP = pa.map_(pa.string(), pa.string())
PART = f"{INTERNAL}part"  # which request of those read together a row is (BodyReader.processed_parts)

# The ISO 8601 spellings whose reading pyarrow's cast and Spark's agree on, from 1900 (no calendar
# rebasing, no year outside four digits): a date, or a date and time with an optional offset.
_DATE = r"(19|[2-9][0-9])[0-9]{2}-[0-9]{2}-[0-9]{2}"
_CLOCK = r"[T ]([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?"
_OFFSET = r"(Z|[+-](0[0-9]|1[0-4]):[0-5][0-9])"
ISO = {"timestamptz": f"^{_DATE}({_CLOCK}{_OFFSET}?)?$", "timestamp": f"^{_DATE}({_CLOCK})?$", "date": f"^{_DATE}$"}
# The same with up to nine digits of a second's fraction (Go's and Docker's nanoseconds), where
# the rest are dropped first (_PAST_MICROS), as Spark's cast drops them (pyarrow's refuses them).
_NANO_CLOCK = _CLOCK.replace("{1,6}", "{1,9}")
ISO_PAST_MICROS = {"timestamptz": f"^{_DATE}({_NANO_CLOCK}{_OFFSET}?)?$", "timestamp": f"^{_DATE}({_NANO_CLOCK})?$"}
_PAST_MICROS = r"^(.{19}\.[0-9]{6})[0-9]+"
# Epoch milliseconds (days for a date) from 1900-01-01 through 9999-12-31, as JSON integers.
EPOCH_RANGE = {"timestamptz": (-2_208_988_800_000, 253_402_300_799_999), "timestamp": (-2_208_988_800_000, 253_402_300_799_999),
               "date": (-25_567, 2_932_896)}
_TIME_TYPES = {"timestamptz": pa.timestamp("us", "UTC"), "timestamp": pa.timestamp("us"), "date": pa.date32()}
# Partition transforms of time columns whose rows this path groups itself (partition_keys).
_TEMPORAL = {"year", "month", "day", "hour"}


def time_kind(data_type: pa.DataType) -> str | None:
    """"timestamptz", "timestamp" or "date" for the table's time columns this path converts."""
    if pa.types.is_timestamp(data_type) and data_type.unit == "us":
        if data_type.tz is None:
            return "timestamp"
        return "timestamptz" if data_type.tz in ("UTC", "+00:00", "Etc/UTC") else None
    return "date" if pa.types.is_date32(data_type) else None

RESULT = T.StructType([T.StructField("path", T.StringType()), T.StructField("counts", T.StringType()), T.StructField("refused", T.StringType()),
                       T.StructField("rejected", T.StringType()), T.StructField("nulled", T.StringType()),
                       T.StructField("dropped", T.StringType()), T.StructField("sink", T.IntegerType())])
RESULT_ARROW = pa.schema([pa.field("path", pa.string()), pa.field("counts", pa.string()), pa.field("refused", pa.string()),
                          pa.field("rejected", pa.string()), pa.field("nulled", pa.string()),
                          pa.field("dropped", pa.string()), pa.field("sink", pa.int32())])
# The requests' frame as append_directly makes it, its bodies shipped or read by the tasks
# (entries' ids). Said to Spark (DataFrame.to) so that mapInArrow, which needs the frame's columns,
# does not ask the server for them: an AnalyzePlan that analyses the whole plan, rows included.
_REQUESTS = {shipped: T.StructType([T.StructField("receipt", T.StringType()), T.StructField("body", T.BinaryType() if shipped else T.StringType()),
                                    T.StructField("seq", T.LongType())]) for shipped in (True, False)}


def parse_schema(schema: pa.Schema, extra_fields: str | None, partition: list[tuple[str, str]] | tuple = ()) -> pa.Schema | None:
    """The schema pyarrow parses with (the table's, without its extra_fields column, its maps of
    strings (read after: `text_maps`) and field metadata; time columns as text, converted after:
    `times`); None when a column's type or a partition transform is not one this path handles."""
    fields = []
    for f in schema:
        if f.name == extra_fields or is_text_map(f.type):
            continue
        if time_kind(f.type) or is_binary(f.type):
            fields.append(pa.field(f.name, pa.string()))
        elif (parsed := nested_parsing(f.type)) is not None:
            fields.append(pa.field(f.name, parsed))
        else:
            return None
    types = {f.name: f.type for f in schema}
    if any(source == extra_fields or source not in types or not _groups_by(transform, types[source]) for source, transform in partition):
        return None
    return pa.schema(fields) if fields else None


def nested_parsing(data_type: pa.DataType, in_list: bool = False, read: bool = True) -> pa.DataType | None:
    """The type pyarrow parses a column of `data_type` with: a plain type as it is; a list or a
    struct of those (at any depth) without the table's field metadata, and a struct's decimals
    (not a list's: the Spark job reads those through a double, coerce.exact_type); a struct's
    optional maps of strings (not a list's) left out, inferred by pyarrow (nested_text_maps).
    None for anything else, and for a list or struct with a required element or field (the Spark
    job says what a null there becomes). read=False: the type once those maps are made (in the
    struct's order, as maps of strings)."""
    if any(check(data_type) for check in _PLAIN_TYPES) or (pa.types.is_decimal128(data_type) and not in_list):
        return data_type
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        element = data_type.value_field
        inner = nested_parsing(element.type, in_list=True, read=read) if element.nullable else None
        return pa.list_(inner) if inner is not None else None
    if pa.types.is_struct(data_type):
        maps = {child.name for child in data_type if child.nullable and not in_list and is_text_map(child.type)}
        children = [(child.name, TEXT_MAP if child.name in maps else nested_parsing(child.type, in_list, read) if child.nullable else None)
                    for child in data_type if not (read and child.name in maps)]
        if not data_type.num_fields or any(inner is None for _name, inner in children):
            return None
        return pa.struct(children)
    return None


def has_nested_maps(data_type: pa.DataType) -> bool:
    """Whether a column of `data_type` holds a map inside a struct (nested_parsing leaves it out)."""
    return pa.types.is_struct(data_type) and any(is_text_map(child.type) or has_nested_maps(child.type) for child in data_type)


def is_binary(data_type: pa.DataType) -> bool:
    return pa.types.is_binary(data_type) or pa.types.is_large_binary(data_type)


def is_nested(data_type: pa.DataType) -> bool:
    return pa.types.is_list(data_type) or pa.types.is_large_list(data_type) or pa.types.is_struct(data_type)


def _groups_by(transform: str, data_type: pa.DataType) -> bool:
    """Whether this path groups rows by `transform` of a column of `data_type` (partition_keys)."""
    if transform == "identity":
        return True
    if transform in _TEMPORAL:
        return time_kind(data_type) is not None and (transform != "hour" or time_kind(data_type) != "date")
    text = pa.types.is_string(data_type) or pa.types.is_large_string(data_type) or is_binary(data_type)
    integer = pa.types.is_int32(data_type) or pa.types.is_int64(data_type)
    if transform.startswith("bucket["):
        return text or integer or time_kind(data_type) is not None
    return transform.startswith("truncate[") and (text or integer)


# pyarrow's error for a JSON string where the explicit schema has a number: the column and the row.
_TEXT_FOR_NUMBER = re.compile(r"Column\(/(.+)\) changed from number to string in row ([0-9]+)$")
MAX_MISTYPED = 16  # events of a request read alone for text in a number column; past them, the Spark job takes it
REREAD_TIMES = 3  # ... and its bytes read again at most this many times over, whatever its size
MAX_SPLITS = 4  # ways a request's events hold numbers in its text columns, each read apart (read_split); past them, read alone
MAX_SPLIT_NAMES = 64  # text columns up to which a task looks for a number in one before reading a body in groups again


def may_read_as_number(text: str) -> bool:
    """Whether Spark's cast might read `text` as a number (coerce.scalar: trimmed, then tried as a
    bigint and a double): any digit (of any script, to be safe), or the words it reads as a
    double's specials (nan, inf, infinity, any case and sign). Text with neither ("slow", "",
    "n/a") is NULL there whatever else it holds."""
    folded = text.casefold()
    return "inf" in folded or "nan" in folded or any(ch.isnumeric() for ch in text)


# A number column's values sent as text ("200", "12.5": a logger that writes every value as a
# string, grok's captures) in the spellings pyarrow's cast reads exactly as Spark's does
# (coerce.scalar: trimmed, then tried as a bigint or a double; both read a decimal as its nearest
# double). Any other spelling of a number ("+12", " 12 ", "12.0" or "1e3" for an integer, "1.",
# "0x1f", "NaN") is left to the Spark job.
INTEGER_TEXT = r"^-?[0-9]{1,18}$"
DECIMAL_TEXT = r"^-?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]{1,3})?$"
_PLAIN_NUMBER_TEXT = re.compile(DECIMAL_TEXT)
_INTEGER_TEXT = re.compile(INTEGER_TEXT)


def _as_int32(numbers: pa.ChunkedArray, name: str) -> pa.ChunkedArray:
    """Whole numbers (int64 or double) of the int column `name` as int32; pa.ArrowInvalid for one
    beyond its range (the Spark job's NULL)."""
    import pyarrow.compute as pc

    bounds = pc.min_max(numbers)
    if bounds["min"].is_valid and (bounds["min"].as_py() < -(2**31) or bounds["max"].as_py() > 2**31 - 1):
        raise pa.ArrowInvalid(f"a number in the int column {name!r} beyond its range")
    return pc.cast(numbers, pa.int32())


def numbers_from_text(table: pa.Table, types: dict[str, pa.DataType], nullable: frozenset[str] | set[str],
                      nulled: dict[str, pa.Array] | None = None) -> pa.Table:
    """`table` with its columns `types` names (read as text) in those number types: a plain
    number's text as its number, and in the columns `nullable` text that cannot be a number
    (may_read_as_number) as NULL, as the Spark job converts them (each such column's rows so
    made NULL in `nulled`, a mask); pa.ArrowInvalid for any other text (the Spark job's) and for
    a value beyond the type's range (its NULL)."""
    import pyarrow.compute as pc

    for name, target in types.items():
        text = table.column(name)
        integral = pa.types.is_int32(target) or pa.types.is_int64(target)
        if not integral and not pa.types.is_float64(target):
            raise pa.ArrowInvalid(f"text in the {target} column {name!r}")
        plain = pc.match_substring_regex(text, INTEGER_TEXT if integral else DECIMAL_TEXT)
        for value in pc.filter(text, pc.invert(plain)).to_pylist():
            if name not in nullable or may_read_as_number(value):
                raise pa.ArrowInvalid(f"text in the number column {name!r} the Spark job may read otherwise: {value[:40]!r}")
        numbers = pc.cast(pc.if_else(plain, text, pa.scalar(None, pa.string())), pa.int64() if integral else target)
        if nulled is not None and pc.any(made_null := pc.fill_null(pc.invert(plain), False)).as_py():
            nulled[name] = made_null
        if pa.types.is_int32(target):
            numbers = _as_int32(numbers, name)
        elif not integral and not pc.all(pc.is_finite(numbers)).as_py():
            raise pa.ArrowInvalid(f"text in the double column {name!r} beyond its range")
        table = table.set_column(table.schema.get_field_index(name), name, numbers)
    return table


# pyarrow's error for a JSON number with a fraction or an exponent where the explicit schema has an
# integer (it names neither the column nor the row).
_FRACTION_FOR_INTEGER = re.compile(r"Failed to convert JSON to u?int(8|16|32|64), couldn't parse:")
_EXACT_IN_A_DOUBLE = 2.0**53  # integers below this read as doubles keep every digit
# pyarrow's error for a JSON number where the explicit schema has a string: the column and the row.
_NUMBER_FOR_TEXT = re.compile(r"Column\(/(.+)\) changed from string to number in row ([0-9]+)$")


def _number_for_text(exc: pa.ArrowInvalid, columns: frozenset[str]) -> str | None:
    """The column of `columns` where pyarrow met a JSON number in a text column, or None."""
    found = _NUMBER_FOR_TEXT.search(str(exc))
    return found[1] if found and found[1] in columns else None


# pyarrow's error for a JSON boolean, object or list where the explicit schema has a string.
_OTHER_FOR_TEXT = re.compile(r"Column\(/(.+)\) changed from string to (boolean|object|array) in row ([0-9]+)$")


def _other_for_text(exc: pa.ArrowInvalid, columns: frozenset[str]) -> str | None:
    """The column of `columns` where pyarrow met a JSON boolean, object or list in a text column, or None."""
    found = _OTHER_FOR_TEXT.search(str(exc))
    return found[1] if found and found[1] in columns else None


_NUMBER_TYPES = frozenset({int, float})  # a JSON number as Python reads it (a boolean's type is bool)
_NUMBER_STARTS = frozenset(b"-0123456789")
_COPIED_TYPES = frozenset({bool, dict, list})  # the other values Spark's JSON reader copies as text into a text column
_BEYOND_64_BITS = 2.0**63  # orjson reads an integer from here on (or below minus this) as a double


def json_event(line: bytes) -> dict:
    """One line's event as Python's json reads it (by orjson, or json where orjson refuses the
    line: but see exact_numbers); pa.ArrowInvalid where it is no JSON object."""
    import orjson

    try:
        try:
            event = orjson.loads(line)
        except orjson.JSONDecodeError:
            event = json.loads(line)
    except ValueError as exc:
        raise pa.ArrowInvalid(f"an event Python's json cannot read: {str(exc)[:100]}") from None
    if not isinstance(event, dict):
        raise pa.ArrowInvalid("an event that is not a JSON object")
    return event


def exact_numbers(event: dict, line: bytes, names: Collection[str]) -> dict:
    """`event` (json_event's of `line`), or the line read by Python's json where one of the fields
    `names` holds a double that may have been an integer beyond 64 bits (orjson reads one so)."""
    if any(type(value := event.get(name)) is float and abs(value) >= _BEYOND_64_BITS for name in names):
        return json.loads(line)
    return event


def spelled_numbers(numbers: pa.ChunkedArray, events: Callable[[int], dict], name: str) -> pa.Array:
    """The text column `name`'s values sent as JSON numbers, some with a fraction or an exponent
    (read as doubles: `numbers`, a row per event), spelled as the Spark job spells them: reading a
    number as text, Jackson writes an integer's digits (-0 as 0, beyond a long too) and any other
    number as Java's Double.toString spells its double (1.50 as 1.5, 1e3 as 1000.0: java_double).
    Which each was is its event's as Python reads it (`events(row)`: json_event; asked only for
    the rows with a value there). pa.ArrowInvalid where a spelling is unsure (Unspellable) or the
    event's value is not the number pyarrow read (a key twice)."""
    import pyarrow.compute as pc

    values = numbers.to_pylist()
    texts: list[str | None] = [None] * len(values)
    for row in pc.indices_nonzero(pc.is_valid(numbers)).to_pylist():
        value = events(row).get(name)
        try:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or float(value) != values[row]:
                raise pa.ArrowInvalid(f"the text column {name!r} read otherwise than its line holds it")
            texts[row] = number_text(value)
        except (Unspellable, OverflowError) as exc:
            raise pa.ArrowInvalid(f"a number in the text column {name!r}: {exc}") from None
    return pa.array(texts, pa.string())


# A key's colon and the JSON number after it, or where any other value starts (quoted_texts).
_NUMBER_AFTER_KEY = re.compile(rb"[ \t\r]*:[ \t\r]*(-?[0-9][0-9.eE+-]*)")
_VALUE_AFTER_KEY = re.compile(rb"[ \t\r]*:[ \t\r]*")


@cache
def _json_key(name: str) -> bytes:
    """A column's name as a JSON key is most often spelled: no escapes but the needed ones."""
    return json.dumps(name, ensure_ascii=False).encode("utf-8", "surrogatepass")


class _KeysBefore:
    """A search for any of some names as a JSON key before a value: `search` (re's, the first),
    and `found`, every one in a body, in order (re's finditer's, read by numpy in compact JSON)."""

    ONE_BY_ONE = 64  # keys of a name's length up to which each is looked at alone (past it, all at once by numpy)

    def __init__(self, names: Collection[str], after: bytes, first_bytes: bytes | None = None) -> None:
        keys = [_json_key(name)[1:-1] for name in sorted(names)]
        self.regex = re.compile(rb'"(' + b"|".join(map(re.escape, keys)) + rb')"[ \t\r]*:[ \t\r]*' + after if keys else rb"(?!)")
        self.by_length: dict[int, tuple[set[bytes], np.ndarray]] = {}  # the keys of each length, and which bytes end one
        for key in keys:
            same, ends = self.by_length.setdefault(len(key), (set(), np.zeros(256, bool)))
            same.add(key)
            ends[key[-1] if key else ord('"')] = True
        self.first = None  # the bytes a value after one of the keys starts with, where `after` is one of them
        if first_bytes is not None:
            self.first = np.zeros(256, bool)
            self.first[list(first_bytes)] = True

    def search(self, text: bytes) -> re.Match | None:
        return self.regex.search(text)

    def found(self, text: bytes, colons: tuple[np.ndarray, np.ndarray] | None) -> list[tuple[int, bytes, int]]:
        """Each key found in `text`: (where its opening quote is, the key as spelled, the first
        byte of its value), in order, as the regex's finditer finds them. In compact JSON (as the
        api writes every line) numpy finds them from each colon after a quote (`colons`:
        key_colons(text), found once for a body's searches), a key's last byte, the quote opening it and then
        its bytes checked: a `mixed` body's two searches (read_split) ~0.4 ms per 1,000 events
        against ~0.85 by the regex, which tries its names at every quote; events of 100 integer
        fields whose names are as long as a text column's, 1.1 against 2.1. Any other text: the regex."""
        if self.first is None or colons is None:
            return [(at.start(), at[1], at[0][-1]) for at in self.regex.finditer(text)]
        data, colons = colons
        colons = colons[self.first[data[colons + 1]]]
        found = []
        last = data[colons - 2]  # the byte before each closing quote: each key's last
        for length, (keys, ends) in self.by_length.items():
            at = colons[ends[last]]
            at = at[at >= length + 2] - length - 2  # where a key of this length would open
            at = at[data[at] == ord('"')]
            if len(at) <= self.ONE_BY_ONE:
                found += [(start, key, text[start + length + 3]) for start in at.tolist() if (key := text[start + 1:start + 1 + length]) in keys]
                continue
            spelled = data[at[:, None] + np.arange(1, length + 1)]  # (many keys of a name's length: wide events) each key's bytes
            for key in keys:
                found += [(start, key, text[start + length + 3]) for start in at[(spelled == np.frombuffer(key, np.uint8)).all(axis=1)].tolist()]
        found.sort()
        return found


def key_colons(text: bytes) -> tuple[np.ndarray, np.ndarray] | None:
    """(text's bytes, where each colon between a quote and another byte is: each key's, in JSON)
    where no whitespace follows a quote or a key's colon (compact JSON, where a key is always
    spelled so: _KeysBefore.found); None elsewhere."""
    data = np.frombuffer(text, np.uint8)
    if len(data) < 4:
        return None
    if b" " in text or b"\t" in text or b"\r" in text:  # (memchr's speed: compact JSON has none but in its strings)
        spaces = np.flatnonzero((data == ord(" ")) | (data == ord("\t")) | (data == ord("\r")))
        before = data[np.maximum(spaces - 1, 0)]
        if ((before == ord('"')) | ((before == ord(":")) & (data[np.maximum(spaces - 2, 0)] == ord('"')))).any():
            return None
    colons = np.flatnonzero(data[1:-1] == ord(":")) + 1
    return data, colons[data[colons - 1] == ord('"')]


def _names_before(names: Collection[str], after: bytes, first_bytes: bytes | None = None) -> _KeysBefore | None:
    """A search for any of `names` as a JSON key before a value starting with `after` (a regex;
    `first_bytes`, the bytes it matches, where it is one of them); None past MAX_SPLIT_NAMES names
    (each is tried in turn: every line is looked at instead)."""
    if len(names) > MAX_SPLIT_NAMES:
        return None
    return _KeysBefore(names, after, first_bytes)


@lru_cache(maxsize=32)  # (a body's text columns holding integers in most lines: bounded, as bodies may name any set)
def _other_than_numbers(names: frozenset[str]) -> _KeysBefore:
    """A search for any of `names` as a JSON key before a value other than an integer or null
    (a fraction or an exponent: not read as an integer)."""
    return _names_before(names, rb'(?:["{\[tf]|-?[0-9]+[.eE])')


def _value_span(line: bytes, after_key: int, pairs: bool = False) -> tuple[int, int, object]:
    """The JSON value after a key's colon in `line` (the key ending at `after_key`): where it
    starts and ends, in bytes, and the value as Python's json reads it (an object as its pairs,
    in order, where `pairs`). ValueError where no colon and value follow (the key's text was a
    value's) or the bytes are no UTF-8."""
    if (colon := _VALUE_AFTER_KEY.match(line, after_key)) is None:
        raise ValueError("no value after the key")
    rest = line[colon.end():].decode("utf-8")
    value, end = json.JSONDecoder(object_pairs_hook=tuple if pairs else None).raw_decode(rest)
    return colon.end(), colon.end() + len(rest[:end].encode("utf-8")), value


def quoted_texts(line: bytes, event: dict, names: Collection[str], numbers: dict[str, int | float | None] | None = None) -> bytes | None:
    """`line` with the value of each of its text columns `names` (a number, a boolean, an object,
    a list) written as the JSON string the Spark job reads it as, so that the line reads with the
    others, those columns as text: Spark's JSON reader copies such a value as Jackson writes it
    (a number as spelled_numbers spells it: an integer's digits, Java's spelling of any other
    double; true and false; an object or a list compactly, as extra_text spells the extra_fields
    map's). `event` is the line as Python reads it (exact_numbers). None where unsure: the
    name's key spelled otherwise or its text found more than once in the line (a nested field, a
    key twice, a value), a spelling unsure (Unspellable), or the line so written read otherwise
    than `event` with those texts. `numbers`: number columns whose text is written as the value
    given, a number (its text as numbers_from_text reads it) or None (NULL, as text that cannot be
    a number is in an optional column)."""
    spots = []
    for name, number in (numbers or {}).items():
        key = _json_key(name)
        if line.count(key) != 1 or not isinstance(event[name], str):
            return None
        try:
            start, end, _text = _value_span(line, line.index(key) + len(key))
        except ValueError:
            return None
        spots.append((start, end, name, number))
    for name in names:
        key = _json_key(name)
        if line.count(key) != 1:
            return None
        value, after_key = event[name], line.index(key) + len(key)
        try:
            if type(value) in _NUMBER_TYPES:
                if (found := _NUMBER_AFTER_KEY.match(line, after_key)) is None:
                    return None
                spots.append((found.start(1), found.end(1), name, number_text(value)))
                continue
            start, end, copied = _value_span(line, after_key, pairs=True)  # (extra_text's objects: their pairs, in order)
            spots.append((start, end, name, extra_text(copied, top=False)))
        except (Unspellable, OverflowError, ValueError):  # (json's errors and a UnicodeDecodeError are ValueErrors)
            return None
    spots.sort()
    pieces, at = [], 0
    for start, end, _name, value in spots:
        pieces += [line[at:start], json.dumps(value).encode() if isinstance(value, str) or value is None else repr(value).encode()]
        at = end
    written = b"".join([*pieces, line[at:]])
    try:
        if json_event(written) != {**event, **{name: text for _start, _end, name, text in spots}}:
            return None
    except pa.ArrowInvalid:
        return None
    return written


# pyarrow's error for a JSON string where the explicit schema has a boolean: the column and the row.
_TEXT_FOR_FLAG = re.compile(r"Column\(/(.+)\) changed from boolean to string in row ([0-9]+)$")
# Text that no trimming and lower-casing makes one of Spark's words for true and false: printable
# ASCII with no space at either end, or none at all (Java lower-cases ASCII letters to ASCII).
_NO_FLAG_TEXT = r"^([!-~]([ -~]*[!-~])?)?$"


def _text_for_flag(exc: pa.ArrowInvalid, columns: frozenset[str]) -> str | None:
    """The column of `columns` where pyarrow met a JSON string in a boolean column, or None."""
    found = _TEXT_FOR_FLAG.search(str(exc))
    return found[1] if found and found[1] in columns else None


def flags_from_text(table: pa.Table, names: list[str], nullable: frozenset[str] | set[str], nulled: dict[str, pa.Array] | None = None) -> pa.Table:
    """`table` with its boolean columns `names` (read as text) as booleans: Spark's words for true
    and false in any ASCII case and nothing around them ("true", "False", "yes", "N", "1") as the
    Spark job converts them (coerce.scalar: trimmed, lower-cased, looked up), and in the columns
    `nullable` other text no trimming makes such a word ("maybe", "") as NULL, as it does (the
    rows so made NULL in `nulled`, as numbers_from_text); pa.ArrowInvalid for any other text (a space or a control character at an end, or other than
    ASCII: the Spark job's)."""
    import pyarrow.compute as pc

    for name in names:
        text = table.column(name)
        word = pc.match_substring_regex(text, BOOLEAN_TEXT)
        if not pc.all(word).as_py():  # (all skips nulls)
            others = pc.filter(text, pc.invert(word))
            if name not in nullable or not pc.all(pc.match_substring_regex(others, _NO_FLAG_TEXT)).as_py():
                raise pa.ArrowInvalid(f"text in the boolean column {name!r} the Spark job may read otherwise")
            if nulled is not None:
                nulled[name] = pc.fill_null(pc.invert(word), False)
        flags = pc.if_else(word, pc.is_in(pc.ascii_lower(text), pa.array(TRUE_TEXTS)), pa.scalar(None, pa.bool_()))
        table = table.set_column(table.schema.get_field_index(name), name, flags)
    return table


# pyarrow's error for a JSON number where the explicit schema has a boolean: the column and the row.
_NUMBER_FOR_FLAG = re.compile(r"Column\(/(.+)\) changed from boolean to number in row ([0-9]+)$")


def _number_for_flag(exc: pa.ArrowInvalid, columns: frozenset[str]) -> str | None:
    """The column of `columns` where pyarrow met a JSON number in a boolean column, or None."""
    found = _NUMBER_FOR_FLAG.search(str(exc))
    return found[1] if found and found[1] in columns else None


def flags_from_numbers(table: pa.Table, names: list[str], nullable: frozenset[str] | set[str],
                       nulled: dict[str, pa.Array] | None = None) -> pa.Table:
    """`table` with its boolean columns `names` (read as integers: 1 and 0 for true and false, as
    some loggers and databases write them) as booleans, as the Spark job converts them: it reads a
    JSON integer as its digits (Jackson spells -0 as 0) and looks them up among its words, where
    "1" and "0" are the only numbers. In the columns `nullable` any other integer is NULL, as
    there (the rows so made NULL in `nulled`, as numbers_from_text); pa.ArrowInvalid for one in
    another column (the DLQ's: the Spark job's to say). A number with a fraction or an exponent
    ("1.0") never reads as an integer: its request is the Spark job's."""
    import pyarrow.compute as pc

    for name in names:
        numbers = table.column(name)
        word = pc.or_(pc.equal(numbers, 0), pc.equal(numbers, 1))
        if not pc.all(word).as_py():  # (all skips nulls)
            if name not in nullable:
                raise pa.ArrowInvalid(f"a number other than 1 and 0 in the boolean column {name!r}")
            if nulled is not None:
                nulled[name] = pc.fill_null(pc.invert(word), False)
        flags = pc.if_else(word, pc.equal(numbers, 1), pa.scalar(None, pa.bool_()))
        table = table.set_column(table.schema.get_field_index(name), name, flags)
    return table


def integers_from_doubles(table: pa.Table, types: dict[str, pa.DataType]) -> pa.Table:
    """`table` with its columns `types` names (read as doubles: JSON numbers with or without a
    fraction) in those integer types, where each is a whole number the double keeps exactly, as
    the Spark job converts them (coerce.scalar: a number with no fraction, 12.0 or 1e3, is that
    integer); pa.ArrowInvalid for any other value (12.5: the Spark job's NULL; beyond 2**53 or
    the type's range: its digits or NULL)."""
    import pyarrow.compute as pc

    for name, target in types.items():
        numbers = table.column(name)
        if not (pa.types.is_int32(target) or pa.types.is_int64(target)):
            raise pa.ArrowInvalid(f"numbers in the {target} column {name!r}")
        whole = pc.and_(pc.equal(numbers, pc.floor(numbers)), pc.less(pc.abs(numbers), _EXACT_IN_A_DOUBLE))
        if not pc.all(whole).as_py():
            raise pa.ArrowInvalid(f"a number in the integer column {name!r} that is no integer a double keeps")
        numbers = _as_int32(numbers, name) if pa.types.is_int32(target) else pc.cast(numbers, target)
        table = table.set_column(table.schema.get_field_index(name), name, numbers)
    return table


class Refused(ValueError):
    """A value this path is not sure to read as the Spark job does: the batch goes to the Spark job."""


def _from_epoch(numbers: pa.ChunkedArray, name: str, kind: str) -> pa.ChunkedArray:
    """Epoch milliseconds (days for a date) as the time column `name`'s type; Refused for one
    beyond EPOCH_RANGE."""
    import pyarrow.compute as pc

    low, high = EPOCH_RANGE[kind]
    bounds = pc.min_max(numbers)
    if bounds["min"].as_py() < low or bounds["max"].as_py() > high:
        raise Refused(f"{name!r}: a number beyond {EPOCH_RANGE[kind]}")
    if kind == "date":
        return numbers.cast(pa.int32()).cast(pa.date32())
    return pc.multiply(numbers, 1000).cast(pa.timestamp("us")).cast(_TIME_TYPES[kind])


# Epoch milliseconds (days) sent as text: digits alone, as the conversion rules read them (coerce.INTEGER).
_EPOCH_TEXT = r"^-?[0-9]{1,18}$"


def times(table: pa.Table, kinds: dict[str, str], epoch: bool) -> pa.Table:
    """`table` with its time columns (name -> time_kind, parsed as text, or as integers when
    `epoch`) in their types: microseconds since 1970 in UTC, or days. Text of digits alone is
    epoch milliseconds (days), as the conversion rules read it. Raises Refused for a value whose
    reading is not sure (see the module's docstring)."""
    import pyarrow.compute as pc

    for name, kind in kinds.items():
        column = table.column(name)
        if column.null_count == len(column):
            converted = pa.nulls(len(column), _TIME_TYPES[kind])
        elif epoch:
            converted = _from_epoch(column, name, kind)
        else:
            iso = pc.all(pc.match_substring_regex(column, ISO[kind])).as_py()  # nulls are skipped
            if not iso and kind in ISO_PAST_MICROS and pc.all(pc.match_substring_regex(column, ISO_PAST_MICROS[kind])).as_py():
                column, iso = pc.replace_substring_regex(column, _PAST_MICROS, r"\1"), True
            if not iso:
                digits = pc.match_substring_regex(column, _EPOCH_TEXT)
                if not pc.all(pc.or_(digits, pc.match_substring_regex(column, ISO[kind]))).as_py():
                    raise Refused(f"{name!r}: a text other than ISO 8601 or epoch digits as this path reads it")
                from_digits = _from_epoch(pc.if_else(digits, column, None).cast(pa.int64()), name, kind)
                converted = pc.coalesce(from_digits, times(pa.table({name: pc.if_else(digits, None, column)}), {name: kind}, False).column(name))
                table = table.set_column(table.schema.get_field_index(name), name, converted)
                continue
            try:
                if kind == "date":
                    converted = column.cast(pa.date32())
                elif kind == "timestamp":
                    converted = column.cast(pa.timestamp("us"))
                elif pc.all(pc.ends_with(column, "Z")).as_py():  # every one in UTC, as most shippers send it (~0.1 ms per 1,000 less)
                    converted = column.cast(pa.timestamp("us", "UTC"))
                else:
                    # With an offset: to UTC by it; without: UTC already (Spark's session zone).
                    offset = pc.match_substring_regex(column, f"{_OFFSET}$")
                    with_offset = pc.if_else(offset, column, None).cast(pa.timestamp("us", "UTC"))
                    without = pc.if_else(offset, None, column).cast(pa.timestamp("us")).cast(pa.timestamp("us", "UTC"))
                    converted = pc.coalesce(with_offset, without)
            except pa.ArrowInvalid as exc:  # a day that does not exist: Spark's NULL, or the DLQ
                raise Refused(f"{name!r}: {str(exc)[:200]}") from None
        table = table.set_column(table.schema.get_field_index(name), name, converted)
    return table


def binaries(table: pa.Table, names: list[str]) -> pa.Table:
    """`table` with its binary columns (`names`, parsed as text) decoded from base64. Raises
    Refused for a text other than canonical base64 (padded, no other character, the last
    character's unused bits zero): the Spark job's decoder reads those too, by rules of its own."""
    import binascii

    for name in names:
        decoded = []
        for text in table.column(name).to_pylist():
            if text is None:
                decoded.append(None)
                continue
            try:
                data = binascii.a2b_base64(text, strict_mode=True)
            except (binascii.Error, ValueError):
                raise Refused(f"{name!r}: a text other than base64 as this path reads it") from None
            if binascii.b2a_base64(data, newline=False).decode() != text:
                raise Refused(f"{name!r}: base64 spelled other than canonically")
            decoded.append(data)
        table = table.set_column(table.schema.get_field_index(name), name, pa.array(decoded, pa.large_binary()))
    return table


def decimal_paths(schema: pa.Schema) -> list[tuple[str, ...]]:
    """Where the decimals of a parsing schema are: columns, and fields of structs at any depth."""
    def below(data_type: pa.DataType, path: tuple[str, ...]) -> list[tuple[str, ...]]:
        if pa.types.is_decimal(data_type):
            return [path]
        if pa.types.is_struct(data_type):
            return [found for child in data_type for found in below(child.type, (*path, child.name))]
        return []

    return [found for f in schema for found in below(f.type, (f.name,))]


def decimals(table: pa.Table, paths: list[tuple[str, ...]]) -> None:
    """Raises Refused when a decimal (at `paths`, parsed by pyarrow, which rounds nothing: a value
    of more fractional digits than the scale refuses the parse) holds a value of more digits
    than its precision: the Spark job's NULL (pyarrow does not check the precision)."""
    import pyarrow.compute as pc

    for path in paths:
        if path[0] not in table.column_names:
            continue
        column = table.column(path[0])
        for name in path[1:]:
            column = pc.struct_field(column, name)
        if column.null_count == len(column):
            continue
        limit = 10 ** (column.type.precision - column.type.scale)
        bounds = pc.min_max(column)
        if bounds["max"].as_py() >= limit or bounds["min"].as_py() <= -limit:
            raise Refused(f"{'.'.join(path)!r}: a number beyond {column.type}")


def partition_keys(data: pa.Table, partition: list[tuple[str, str]]) -> list[pa.ChunkedArray]:
    """One column per partition field whose values are equal exactly where the rows' partition
    values are (the values themselves come from each file's statistics when it is committed)."""
    import pyarrow.compute as pc

    keys = []
    for source, transform in partition:
        column = data.column(source)
        if transform in _TEMPORAL:
            column = pc.floor_temporal(column, unit=transform)
        elif transform.startswith("bucket["):
            column = buckets(column, int(transform[len("bucket["):-1]))
        elif transform.startswith("truncate["):
            width = int(transform[len("truncate["):-1])
            if is_binary(column.type):
                column = pc.binary_slice(column, 0, width)  # bytes
            elif pa.types.is_integer(column.type):  # v // width, rounded down for negatives too
                column = column.cast(pa.int64())
                quotient = pc.divide(column, width)  # rounded toward zero
                column = pc.subtract(quotient, pc.less(pc.subtract(column, pc.multiply(quotient, width)), 0).cast(pa.int64()))
            else:
                column = pc.utf8_slice_codeunits(column, 0, width)  # code points, as Iceberg's
        keys.append(column)
    return keys


def _in_order(data: pa.Table, keys: list[str]) -> bool:
    """Whether the rows are already as sorting by `keys` would leave them (a stable sort: the
    same order): each key but the last one value throughout, the last never descending, none
    null. The commonest batch (a day's events, in the order they came) then skips the sort,
    which moves every column."""
    import pyarrow.compute as pc

    if data.num_rows < 2 or any(data.column(key).null_count for key in keys):
        return data.num_rows < 2
    for key in keys[:-1]:
        if pc.count_distinct(data.column(key)).as_py() != 1:
            return False
    last = data.column(keys[-1])
    return pc.all(pc.less_equal(last.slice(0, data.num_rows - 1), last.slice(1))).as_py()


def write_partitioned(data: pa.Table, directory: str, filesystem, schema: pa.Schema,  # noqa: ANN001
                      partition: list[tuple[str, str]], max_records: int | None = None) -> list[tuple[str, int, tuple]]:
    """`data` as Parquet files in `schema` under `directory` (as `filesystem` names it), one per
    partition value (and `max_records` rows at most): the rows sorted by keys equal where their
    values are (partition_keys)."""
    keys = [f"{INTERNAL}p{index}" for index in range(len(partition))]
    for name, column in zip(keys, partition_keys(data, partition)):
        data = data.append_column(name, column)
    if keys and not _in_order(data, keys):
        data = data.sort_by([(name, "ascending") for name in keys])
    return write_runs(data.combine_chunks().to_batches(), directory, filesystem, schema, keys, max_records, described=bucket_metadata(partition))


def bucket_metadata(partition: list[tuple[str, str]]) -> Callable[[tuple], dict[str, str]] | None:
    """A file's BUCKETS_METADATA from its partition keys' values (partition_keys: a bucket's is its
    number), None for a partition without buckets. The committer would otherwise read each file's
    source column back and hash its every value (`orders`, bucket[8] of a string: 41% of its CPU)."""
    places = [index for index, (_source, transform) in enumerate(partition) if transform.startswith("bucket[")]
    if not places:
        return None
    return lambda key: {BUCKETS_METADATA: json.dumps([[*partition[index], key[index]] for index in places])}


def append_directly(
    spark: SparkSession, receipts: list[str], bodies: list[bytes], directory: str, filesystem: object | None,
    parsing: pa.Schema, file_schema: pa.Schema, required: frozenset[str], extra_fields: str | None = None,
    partition: list[tuple[str, str]] | tuple = (), changes: bool = False, entries: StreamEntries | None = None,
    by_request: bool = False, processors: tuple[list[tuple], list[str]] | None = None, target_file_size: int | None = None,
    task_bytes: int | None = None, text_nulls: bool = False, dropping: str | None = None,
) -> tuple[dict[str, int] | None, str | None, list[int], dict[str, tuple[list[str], int]], dict[str, tuple[list[str], int]]]:
    """Write the bodies' events as Parquet files under `directory`: (rows per receipt, None, [],
    per receipt the columns where a value was made NULL by its conversion and in how many events,
    per receipt the fields no column took and in how many events), or (None, why not, [], {}, {})
    with nothing left behind. by_request: a request (body) that this way
    cannot take is left out instead of refusing the batch, and the third item lists the places in
    `bodies` of those left out (the caller runs them through the Spark job); the batch is still
    refused whole when the tasks cannot read the bodies. extra_fields: the table's map column for the fields
    it lacks (None: such a field refuses the batch); partition: the table's (source, transform)
    fields, one file per partition value (parse_schema said it handles them). changes: the events
    change rows (a sink with identifier columns and no operation expression: each inserts, or
    upserts): they are kept as the Spark job keeps them, unpartitioned, each with its operation,
    its place in the batch and its receipt (spark_jobs/changes_job.py applies them later).
    entries: where the tasks read the bodies themselves (stream_bodies.py; `bodies` are not
    shipped); when they cannot, the answer's reason starts with UNREACHABLE. processors: a plan
    of plain_processors.py, applied to each request's rows (a request with a field the table lacks
    is then left out: the Spark job spells such fields from the types it infers). target_file_size:
    the sink's, in bytes: a task's files hold the rows files.rows_per_file says at most (by the
    JSON size of the requests it wrote, as the Spark job estimates it). task_bytes: one task per
    this many bytes of bodies, at least one, at most one per request (None: Spark's split, one task
    per core). Each task costs Spark's JVM and a Python worker ~40 ms of CPU whatever it holds,
    while the writers run their jobs side by side: fewer, fuller tasks leave more of the cores to
    the work itself (make bench, README "The short way"). text_nulls: the table's columns are
    converted as the full job converts a known table's (no processors, no evolving schema, no
    row changes), so text that cannot be a number in an optional number column (not a partition's
    source) reads as NULL there, as the full job makes it, instead of leaving its request out.
    dropping: fields the table lacks, without extra_fields, are left out and named as the full
    job names them (BodyReader.dropped_fields: DROP_KEYS or DROP_VALUES), instead of leaving their
    request out (None)."""
    sink = sink_arguments(directory, filesystem, parsing, file_schema, required, extra_fields, partition, changes, processors,
                          target_file_size, text_nulls, dropping)
    answers, refused, rejected = _run_tasks(spark, receipts, bodies, [sink], entries, by_request, task_bytes)
    if answers is None:
        return None, refused, [], {}, {}
    ((counts, made_null, dropped),) = answers
    return counts, None, rejected, made_null, dropped


def append_routed(
    spark: SparkSession, receipts: list[str], bodies: list[bytes], sinks: list[tuple], entries: StreamEntries | None = None,
    task_bytes: int | None = None,
) -> tuple[list[tuple[dict[str, int], dict[str, tuple[list[str], int]]]] | None, str | None, list[int], dict]:
    """append_directly for several sinks in one job (sink_arguments each; no row changes): each
    task reads its requests once and writes each sink's rows of them (its processors, its routes'
    condition among them). All or nothing: ([(rows per receipt, NULLed columns per receipt)] a
    sink, None, [], {}), or (None, why not, [], {}) with no sink's files left behind."""
    answers, refused, _rejected = _run_tasks(spark, receipts, bodies, sinks, entries, False, task_bytes)
    return answers, refused, [], {}


def sink_arguments(directory: str, filesystem: object | None, parsing: pa.Schema, file_schema: pa.Schema, required: frozenset[str],
                   extra_fields: str | None = None, partition: list[tuple[str, str]] | tuple = (), changes: bool = False,
                   processors: tuple[list[tuple], list[str]] | None = None, target_file_size: int | None = None,
                   text_nulls: bool = False, dropping: str | None = None) -> tuple:
    """One sink's part of a short-way task's arguments (append_directly's, which see), as plain data."""
    if filesystem is None:
        from pyarrow import fs as pafs

        filesystem = pafs.LocalFileSystem()
    if changes:
        file_schema = file_schema.append(pa.field(OP, pa.string())).append(pa.field(SEQ, pa.int64())).append(pa.field(RECEIPT, pa.string()))
        partition = ()
    return (_path(directory), filesystem, parsing, file_schema, required, extra_fields, list(partition), changes, processors,
            target_file_size, text_nulls, dropping)


def _run_tasks(spark: SparkSession, receipts: list[str], bodies: list[bytes], sinks: list[tuple], entries: StreamEntries | None,
               by_request: bool, task_bytes: int | None) -> tuple[list[tuple[dict[str, int], dict]] | None, str | None, list[int]]:
    """One short-way job writing `sinks` (sink_arguments each): per sink its rows per receipt and
    NULLed columns per receipt, and the places of the requests left out; or (None, why not, [])
    with every file written deleted."""
    frame = spark.createDataFrame(pa.table({
        "receipt": pa.array(receipts, pa.string()),
        "body": pa.array(bodies, pa.large_binary()) if entries is None else pa.array(entries.ids, pa.string()),
        "seq": pa.array([index * LINE_SLOTS for index in range(len(bodies))], pa.int64()),
    })).to(_REQUESTS[entries is None])
    append = _task(sinks, entries, by_request)
    if task_bytes is not None:
        # coalesce, not repartition: adjacent requests share a task, with no shuffle.
        frame = frame.coalesce(tasks_for(bodies, task_bytes))
    # toArrow, not collect: collect asks the server for a setting first (a round trip of its own).
    # With the schema said above, a job's round trips before it runs go from three to one (the
    # settings createDataFrame reads): the JVM's gRPC threads spend about half the CPU they did
    # (README, "The Spark JVM in make bench is a young one").
    answer = frame.mapInArrow(append, RESULT).toArrow()
    results = [_AnswerRow(*row) for row in zip(*(answer.column(name).to_pylist() for name in RESULT.names))]
    refused = next((row.refused for row in results if row.refused), None)
    if refused is not None:
        for row in results:
            if row.path:
                try:
                    sinks[row.sink][1].delete_file(row.path)
                except OSError:
                    pass  # orphan removal takes it later
        return None, refused, []
    answers = []
    for index in range(len(sinks)):
        counts: dict[str, int] = {}
        mine = [row for row in results if row.sink == index]
        for row in mine:
            for receipt, rows in json.loads(row.counts or "{}").items():
                counts[receipt] = counts.get(receipt, 0) + rows
        answers.append((counts, _named_by_receipt(row.nulled for row in mine), _named_by_receipt(row.dropped for row in mine)))
    rejected = sorted({seq // LINE_SLOTS for row in results for seq in json.loads(row.rejected or "[]")})
    return answers, None, rejected


def _named_by_receipt(texts: Iterable[str | None]) -> dict[str, tuple[list[str], int]]:
    """The answer rows' names per receipt (NULLed columns, or dropped fields), at most MAX_DROPPED_NAMES each, and how many events had any."""
    return {receipt: (names[:MAX_DROPPED_NAMES], events) for text in texts for receipt, (names, events) in json.loads(text or "{}").items()}


def _named(rows_by_name: dict[str, set[int]]) -> tuple[list[str], int]:
    """A request's names (NULLed columns, or dropped fields) and how many of its events had any, from the rows by name."""
    return sorted(rows_by_name), len(set().union(*rows_by_name.values()))


class _AnswerRow(NamedTuple):
    """One row of a short-way job's answer (RESULT)."""

    path: str | None
    counts: str | None
    refused: str | None
    rejected: str | None
    nulled: str | None
    dropped: str | None
    sink: int


def tasks_for(bodies: list[bytes], task_bytes: int) -> int:
    """How many tasks write `bodies`: one per `task_bytes` of them, at least one, at most one per body."""
    return max(1, min(len(bodies), -(-sum(map(len, bodies)) // task_bytes)))


def text_maps(table: pa.Table, lines: Sequence[bytes], names: list[str], shells: bool = False, known: list[str] | None = None) -> pa.Table:
    """`table` (parsed from `lines`, the columns `names` inferred: an object as a struct) with those
    columns as maps of strings, each event's entries in key order, as the Spark job writes them:
    NULL where the event has none or null. Raises Refused for a value that is not an object of
    strings (a number, a null, a nested object: the Spark job says what those become).
    shells: the columns `names` were read as empty structs (which events have an object, not what
    it holds): every line is read again; one with a field outside `known` (when given) raises
    Refused too, as the fields the table lacks were not inferred."""
    import orjson

    present = []
    for name in names:
        if name not in table.column_names or table.column(name).null_count == table.num_rows:
            continue
        column_type = table.column(name).type
        # (Text pyarrow took for a time, "2025-11-22", is a string here: orjson reads it so.)
        if not pa.types.is_struct(column_type) or not all(pa.types.is_string(f.type) or pa.types.is_timestamp(f.type) for f in column_type):
            raise Refused(f"{name!r}: a value other than an object of strings")
        present.append(name)
    converted = (_struct_maps(table, lines, present) if present and not shells else None) or {}
    if shells or (present and not converted):  # the lines read again
        import pyarrow.compute as pc

        if shells:
            rows = list(range(table.num_rows))
        else:
            rows = pc.indices_nonzero(reduce(pc.or_, [pc.is_valid(table.column(name)) for name in present])).to_pylist()
        events = []
        for row in rows:
            try:
                events.append(orjson.loads(lines[row]))
            except orjson.JSONDecodeError as exc:  # text pyarrow read and orjson does not (bytes that are not UTF-8)
                raise Refused(f"event {row}: {exc}") from None
        if known is not None:
            taken = set(known)
            if other := next((key for event in events for key in event if key not in taken), None):
                raise Refused(f"a field the table lacks: {other[:200]!r}")
        converted = {name: _map_column(name, rows, events, table.num_rows) for name in present}
    for name in names:
        column = converted.get(name, pa.nulls(table.num_rows, TEXT_MAP))
        index = table.schema.get_field_index(name)
        table = table.set_column(index, name, column) if index >= 0 else table.append_column(name, column)
    return table


# A struct costs ~15 microseconds per key to take apart, a line ~2 to read again: past one key per
# eight events in a column's objects (a key per request id, say), the lines are read again.
_EVENTS_PER_STRUCT_KEY = 8


def _many_keys(struct: pa.DataType, rows: int) -> bool:
    """Whether objects inferred as `struct` over `rows` events have too many keys to take apart."""
    return struct.num_fields > max(8, rows // _EVENTS_PER_STRUCT_KEY)


def _struct_maps(table: pa.Table, lines: Sequence[bytes], names: list[str]) -> dict[str, pa.MapArray] | None:
    """The columns `names` of `table` (structs of strings, as pyarrow inferred each event's object)
    as maps of strings in key order, without reading each line again; None where the struct may
    not say what the object holds, so the caller reads the lines: a field null in an event whose
    line holds a JSON null (a key with null, which is an entry, not an absent key), or text that is
    not UTF-8. (pyarrow refuses a key twice and an unpaired surrogate, as orjson does.)"""
    if any(_many_keys(table.column(name).type, table.num_rows) or not all(pa.types.is_string(f.type) for f in table.column(name).type) for name in names):
        return None
    maps = {}
    for name in names:
        struct = table.column(name).combine_chunks()
        converted = _strings_map(struct, struct.is_valid().to_numpy(zero_copy_only=False), lines)
        if converted is None:
            return None
        maps[name] = converted
    return maps


def _strings_map(struct: pa.StructArray, valid: np.ndarray, lines: Sequence[bytes]) -> pa.MapArray | None:
    """A struct of strings (objects pyarrow inferred, one per line of `lines`; `valid`: where an
    event has one) as maps of strings in key order; None where the struct may not say what an
    object holds (_struct_maps)."""
    order = sorted(range(struct.type.num_fields), key=lambda index: struct.type.field(index).name)
    keys = pa.array([struct.type.field(index).name for index in order], pa.string())
    children = [struct.field(index) for index in order]
    count, width = len(struct), len(children)
    held = np.zeros((count, width), bool)
    for slot, child in enumerate(children):
        held[:, slot] = child.is_valid().to_numpy(zero_copy_only=False) & valid
    counts = held.sum(axis=1)
    gaps = np.flatnonzero((counts < width) & valid)  # objects without one of the keys, or with null for it
    if any_line_holds(lines, gaps, b"null"):
        return None
    rows, slots = np.divmod(np.flatnonzero(held.ravel()), width or 1)  # row by row, each row's keys in key order
    values = pa.concat_arrays(children).take(pa.array(slots * count + rows)) if width else pa.array([], pa.string())
    try:
        keys.validate(full=True)
        values.validate(full=True)
    except pa.ArrowInvalid:  # bytes that are not UTF-8, which pyarrow passes through
        return None
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    return pa.MapArray.from_arrays(pa.array(offsets), keys.take(pa.array(slots)), values, type=TEXT_MAP, mask=pa.array(~valid))


def nested_text_maps(struct: pa.StructArray, made: pa.StructType, valid: np.ndarray, lines: Sequence[bytes], path: tuple[str, ...]) -> pa.StructArray:
    """An object column as pyarrow read it (`struct`, at `path` in each event: its maps of strings
    inferred as structs, nested_parsing) in the type `made` (nested_parsing's read=False), each
    map in key order as text_maps makes them; `valid`: where an event has the object. Where the
    struct may not say what a map's objects hold (a null in a line of an object lacking one of its
    keys, text pyarrow took for a time, many keys), those lines are read again by orjson. Raises
    Refused for a key its column lacks or a value other than an object of strings (a null, a
    number, an object: the Spark job says what those become)."""
    if any(made.get_field_index(child.name) < 0 for child in struct.type):
        raise Refused("a field inside an object that its column lacks")
    children = []
    for field in made:
        index = struct.type.get_field_index(field.name)
        child = struct.field(index) if index >= 0 and not pa.types.is_null(struct.type.field(index).type) else pa.nulls(len(struct), field.type)
        if field.type == TEXT_MAP and child.type != TEXT_MAP:
            if not pa.types.is_struct(child.type) or not all(pa.types.is_string(f.type) or pa.types.is_timestamp(f.type) for f in child.type):
                raise Refused(f"{field.name!r}: a value other than an object of strings")
            held = valid & child.is_valid().to_numpy(zero_copy_only=False)
            converted = None
            if all(pa.types.is_string(f.type) for f in child.type) and not _many_keys(child.type, len(child)):
                converted = _strings_map(child, held, lines)
            child = converted if converted is not None else _map_at(lines, np.flatnonzero(held).tolist(), (*path, field.name), len(struct))
        elif pa.types.is_struct(field.type) and has_nested_maps(field.type) and pa.types.is_struct(child.type):
            child = nested_text_maps(child, field.type, valid & child.is_valid().to_numpy(zero_copy_only=False), lines, (*path, field.name))
        children.append(child)
    return pa.StructArray.from_arrays(children, fields=[field.with_type(child.type) for field, child in zip(made, children)], mask=pa.array(~valid))


def _map_at(lines: Sequence[bytes], rows: list[int], path: tuple[str, ...], count: int) -> pa.Array:
    """The maps of strings at `path` in the events of `rows` (read again by orjson; any other
    row's: NULL), as _map_column makes them."""
    import orjson

    objects = []
    for row in rows:
        try:
            value = orjson.loads(lines[row])
        except orjson.JSONDecodeError as exc:  # text pyarrow read and orjson does not (bytes that are not UTF-8)
            raise Refused(f"event {row}: {exc}") from None
        for key in path:
            value = value.get(key) if type(value) is dict else None
        objects.append({path[-1]: value})
    return _map_column(path[-1], rows, objects, count)


def _map_column(name: str, rows: list[int], events: list[dict], count: int) -> pa.Array:
    """Column `name` of `count` events as a map of strings: events[i] (an event's object, from
    orjson) is row rows[i]'s; any other row has none. Built from flat lists of keys and values."""
    offsets, keys, values, missing = [0], [], [], [True] * count
    at = 0
    for row, event in zip(rows, events):
        while at < row:  # rows without an object: none
            offsets.append(len(keys))
            at += 1
        value = event.get(name)
        if value is not None:
            if type(value) is not dict:
                raise Refused(f"{name!r}: a value other than an object of strings")
            ordered = sorted(value)
            keys.extend(ordered)
            values.extend(map(value.__getitem__, ordered))
            missing[row] = False
        offsets.append(len(keys))
        at += 1
    offsets.extend([len(keys)] * (count - at))
    try:
        items = pa.array(values, pa.string())
    except (pa.ArrowTypeError, pa.ArrowInvalid):
        raise Refused(f"{name!r}: a value other than an object of strings") from None
    if items.null_count:  # a null inside the object: the Spark job says what it becomes
        raise Refused(f"{name!r}: a null inside an object of strings")
    return pa.MapArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(keys, pa.string()), items, type=TEXT_MAP,
                                   mask=pa.array(missing, pa.bool_()))


class Unspellable(ValueError):
    """A value whose text in the extra_fields map this path cannot be sure to spell as Spark does."""


def extra_text(value: object, top: bool = True) -> str:
    """A JSON value (from json.loads with object_pairs_hook=tuple: an object is a tuple of its
    (key, value) pairs, in order, duplicates kept as Spark copies them) as the Spark job's
    extra_fields map keeps it: Spark's JSON functions read it as a string, which is Jackson's
    compact copy of it (a string at the top as it is; numbers re-spelled: 1e3 as 1000.0, 1.50 as
    1.5). Raises Unspellable where the spelling is not certain."""
    if top and type(value) is str:
        return _checked(value)
    return _SPELLED[type(value)](value)


def _object_text(pairs: tuple) -> str:
    return "{" + ",".join([f"{_quoted(key)}:{_SPELLED[type(item)](item)}" for key, item in pairs]) + "}"


def _list_text(items: list) -> str:
    return "[" + ",".join([_SPELLED[type(item)](item) for item in items]) + "]"


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _checked(text: str) -> str:
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise Unspellable("an unpaired surrogate in a string") from None
    return text


# What a string needs more than its quotes for: a character to escape, a surrogate (unpaired: json
# reads "\\ud800" as one) or one beyond the Basic Multilingual Plane.
_QUOTED_WITH_CARE = re.compile(r'[\x00-\x1f"\\\ud800-\udfff\U00010000-\U0010ffff]')


def _quoted(text: str) -> str:
    """A string as Jackson writes it: quote, backslash and the five short escapes; any other
    control character (Jackson writes \\u001F in capitals) is Unspellable."""
    if _QUOTED_WITH_CARE.search(text) is None:  # most strings: a search at C speed, not a step per character
        return f'"{text}"'
    _checked(text)
    if any(c < " " or c in '"\\' for c in text):
        if any(c < " " and c not in "\b\f\n\r\t" for c in text):
            raise Unspellable("a control character in a string")
        text = "".join(_ESCAPES.get(c, c) for c in text)
    if not text.isascii() and any(c > "\uffff" for c in text):
        text = "".join(_surrogates(c) if c > "\uffff" else c for c in text)
    return f'"{text}"'


def _surrogates(c: str) -> str:
    """A character beyond the Basic Multilingual Plane as Jackson writes it inside JSON text: its
    UTF-16 surrogates, each escaped in capitals (\\uD800\\uDC00; Jackson's default leaves
    COMBINE_UNICODE_SURROGATES_IN_UTF8 off)."""
    code = ord(c) - 0x10000
    return f"\\u{0xD800 + (code >> 10):04X}\\u{0xDC00 + (code & 0x3FF):04X}"


# Each type json.loads (with object_pairs_hook=tuple) makes, spelled inside an object or a list
# (a dispatch by exact type: bool is not int here).
_SPELLED: dict[type, Callable[[object], str]] = {
    str: _quoted, int: str, float: lambda value: java_double(value), bool: lambda value: "true" if value else "false",
    type(None): lambda _value: "null", tuple: _object_text, list: _list_text,
}


def number_text(value: int | float) -> str:
    """A JSON number as the Spark job reads it as text: an integer's digits (Jackson's, beyond
    a long too), any other number as Java's Double.toString spells its double (java_double)."""
    return str(value) if isinstance(value, int) else java_double(value)


def java_double(x: float) -> str:
    """x as Java 17's Double.toString spells it: positional from 1e-3 to 1e7 (always a point),
    otherwise d.dddE<n>. Checked against Java 17 on 600,000 values and every power of two: equal
    for normal numbers below 1e16 but powers of two of more than 8 shortest digits (Unspellable);
    from there, and for subnormal ones (below 2.2e-308: 5e-324 is 4.9E-324), Java's digits
    are not always the shortest, so those are Unspellable."""
    if not math.isfinite(x) or abs(x) >= 1e16 or 0 < abs(x) < sys.float_info.min:
        raise Unspellable(f"the number {x!r}")
    if x == 0:
        return "-0.0" if math.copysign(1.0, x) < 0 else "0.0"
    sign, digits, exponent = Decimal(repr(x)).as_tuple()
    shown = "".join(map(str, digits)).rstrip("0") or "0"
    if len(shown) > 8 and math.frexp(x)[0] in (0.5, -0.5):
        # A power of two of more than 8 shortest digits: Java 17 prints more digits than needed
        # for 344 of the 2,152 normal ones below 1e16 (2**-24: 5.9604644775390625E-8; the
        # shortest of those has 14), never for one of 8 or fewer (2**-10: 9.765625E-4).
        raise Unspellable(f"the number {x!r}, a power of two")
    point = len(digits) + exponent  # digits before the decimal point
    minus = "-" if sign else ""
    if 1e-3 <= abs(x) < 1e7:
        if point <= 0:
            return f"{minus}0.{'0' * -point}{shown}"
        if point >= len(shown):
            return f"{minus}{shown}{'0' * (point - len(shown))}.0"
        return f"{minus}{shown[:point]}.{shown[point:]}"
    return f"{minus}{shown[0]}.{shown[1:] or '0'}E{point - 1}"


class FallbackMemory:
    """Whether a way tried first gave up on one of a task's last bodies: the next few go straight
    to the way after it, as a producer's bodies are alike, and then it is tried again. For
    reading a body's fields from its layout (_JsonLayout.unknown_fields: most values not sure, a
    key twice; a body given up on costs ~3 ms per 1,000 events more than reading every line
    alone) and for inferring the fields a table lacks (a field of changing type: pyarrow's read
    stops where its type changes, up to a whole read wasted)."""

    SKIPPED = 8

    def __init__(self, skipped: int = SKIPPED) -> None:
        self.skipped = skipped  # bodies that go straight to the way after it once it gave up on one
        self.skips = 0

    def worth_trying(self) -> bool:
        if self.skips:
            self.skips -= 1
            return False
        return True

    def gave_up(self) -> None:
        self.skips = self.skipped


def extra_maps(table: pa.Table, lines: Sequence[bytes], known: list[str], every_line: bool = False, body: bytes | None = None,
               memory: FallbackMemory | None = None, texts: dict[str, list[msgspec.Raw | None]] | None = None) -> pa.Array:
    """The extra_fields map of each event of `table` (parsed from `lines`, the non-blank lines of `body`, fields outside `known`
    inferred as columns of their own): NULL where the event has no non-null field outside
    `known`, else those fields' text by extra_text, in the event's order. every_line: the other
    fields were not inferred (ignored), so every line is read for them (from where `body`'s keys
    and values are, where sure and where `memory` says it is worth trying; without `body`, each
    line by Python's json). texts: the body's texts of some of those fields, each event's (_raw_values's), where known.
    Raises Unspellable (or ValueError) where unsure."""
    import pyarrow.compute as pc

    inferred = [(name, table.column(name)) for name in table.column_names if name not in known]
    named = [(name, column) for name, column in inferred if column.null_count < len(column)]
    held = [column for _name, column in named]
    if not every_line and held and len(held) <= MANY_INFERRED and (by_column := _extras_by_column(named, body or b"\n".join(lines), texts)) is not None:
        return by_column
    if every_line or len(held) > MANY_INFERRED or any(column.null_count == 0 for column in held):
        # Each event has some, or the columns are too many to ask one by one (wide events), or
        # pyarrow could not infer them: read from where the body's keys and values are, where sure.
        if body is not None and (memory is None or memory.worth_trying()):
            if (by_layout := _JsonLayout(body).unknown_fields(known, table.num_rows)) is not None:
                return by_layout
            if memory is not None:
                memory.gave_up()
        rows: list[int] = list(range(table.num_rows))
    elif held:
        rows = pc.indices_nonzero(reduce(pc.or_, [pc.is_valid(column) for column in held])).to_pylist()
    else:
        return pa.nulls(table.num_rows, TEXT_MAP)
    maps: list[list[tuple[str, str]] | None] = [None] * table.num_rows
    taken = set(known)
    decode = json.JSONDecoder(object_pairs_hook=tuple).decode
    for row in rows:
        pairs = decode(lines[row].decode())
        if len({key for key, _value in pairs}) != len(pairs):
            raise Unspellable("a key twice in an event")
        maps[row] = [(_checked(key), extra_text(value)) for key, value in pairs if key not in taken and value is not None] or None
    return pa.array(maps, TEXT_MAP)


MANY_INFERRED = 16  # more inferred columns than this: every line is read rather than each column asked
# How BodyReader.dropped_fields names the fields a table without extra_fields lacks: a table as it
# is (every key), an evolving one (the fields with a value, none of which may become a column).
DROP_KEYS, DROP_VALUES = "keys", "values"
# An evolving table's request with more fields the table lacks: the full job's (a batch of more
# fields than max_table_columns is parsed with fewer, its dropped fields named by their keys).
MAX_DROPPED_INFERRED = 200


def _holds_empty_object(data_type: pa.DataType) -> bool:
    """Whether pyarrow inferred an empty object ({}) somewhere in a value of this type."""
    if pa.types.is_struct(data_type):
        return data_type.num_fields == 0 or any(_holds_empty_object(data_type.field(i).type) for i in range(data_type.num_fields))
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type):
        return _holds_empty_object(data_type.value_type)
    return False


def _object_fields(table: pa.Table, known: list[str]) -> tuple[str, ...]:
    """The columns of `table` outside `known` (inferred), where each is a struct (an object or a
    null wherever sent) and they are at most MANY_INFERRED (BodyReader.object_fields)."""
    unknown = [field for field in table.schema if field.name not in known]
    if len(unknown) > MANY_INFERRED or not all(pa.types.is_struct(field.type) for field in unknown):
        return ()
    return tuple(field.name for field in unknown)


def _extras_by_column(held: list[tuple[str, pa.ChunkedArray]], body: bytes, texts: dict[str, list[msgspec.Raw | None]] | None = None) -> pa.Array | None:
    """extra_maps's answer from the columns pyarrow inferred for the fields the table lacks,
    without reading a line again, where it is sure to be the same; None elsewhere. Sure where every
    such column holds strings, numbers or booleans (kept as extra_text spells them: a string as it
    is, an integer's digits, a double as _extra_double_texts says, true or false; pyarrow refuses a key
    twice in an event and a string that is no Unicode) or objects and lists whose text is their
    copy (_value_copies: each event's own field, as msgspec finds it), its name is plain ASCII,
    and where an event holds two or more of them or a double column a whole number, each key is
    spelled without escapes, once in its line (where it is gives the map's order, the event's, and
    the whole number's text). A traced service's events (a trace and a span id each) cost a task
    ~1 ms per 1,000 events this way against ~6 reading every line; three fields of a number, a
    fraction and a flag, ~2 against ~22."""
    import pyarrow.compute as pc

    for name, column in held:
        if not (pa.types.is_string(column.type) or pa.types.is_int64(column.type) or pa.types.is_boolean(column.type)
                or pa.types.is_float64(column.type) or _is_nested(column.type)):
            return None
        if not (name.isascii() and name.isprintable()) or any(c in name for c in '"\\/'):  # spelled only as they are, but for \u
            return None
    data = np.frombuffer(body, np.uint8)
    found: dict[str, np.ndarray | None] = {}
    rows = len(held[0][1])
    objects = [name for name, column in held if _is_nested(column.type)]
    if texts is not None and all(name in texts for name in objects):
        values = [texts[name] for name in objects]
    elif objects and (values := _raw_values(body, tuple(objects), rows)) is None:
        return None

    def keys_at(name: str, count: int) -> np.ndarray | None:
        """Where the key `name` is in the body, once for each of the `count` events holding it;
        None where not sure. Without \\u escapes, a key of these names can only be spelled as it is:
        each event holding one holds its text at least once, so as many times in the body as
        events hold it says once each, and nowhere else (not in a value, not in a nested object,
        not in a null's key)."""
        if name not in found:
            sure = not (b"\\" in body and b"\\u" in body)  # a byte's search is memchr's, ten times a pair's speed
            at = places(data, f'"{name}"'.encode()) if sure else None
            found[name] = at if at is not None and len(at) == count else None
        return found[name]

    texts = []
    for name, column in held:
        if pa.types.is_float64(column.type):
            if (spelled := _extra_double_texts(column.combine_chunks(), name, body, keys_at)) is None:
                return None
            texts.append(spelled)
        elif _is_nested(column.type):
            if (copied := _value_copies(values[objects.index(name)], column.combine_chunks())) is None:
                return None
            texts.append(copied)
        else:
            texts.append(pc.cast(column, pa.string()).combine_chunks())
    width = len(texts)
    valid = np.stack([text.is_valid().to_numpy(zero_copy_only=False) for text in texts])  # width x rows
    counts, counts_by_column = valid.sum(axis=0), valid.sum(axis=1)
    # Entry (row, j) is the columns' concatenation's j * rows + row: in each row, the columns' order.
    entries = (np.arange(rows)[:, None] + np.arange(width)[None, :] * rows)[valid.T]
    if width > 1 and (counts > 1).any():
        # The map keeps the event's order: where each key is in the body says it.
        at = np.full((width, rows), -1, dtype=np.int64)
        for j, (name, _column) in enumerate(held):
            if (where := keys_at(name, counts_by_column[j])) is None:
                return None
            at[j, valid[j]] = where
        entries = entries[np.argsort(at.T[valid.T], kind="stable")]  # a line's keys come after the lines' before it
    values = pa.concat_arrays(texts).take(pa.array(entries))
    keys = pa.array([name for name, _column in held], pa.string()).take(pa.array(entries // rows))
    offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
    return pa.MapArray.from_arrays(offsets, keys, values, type=TEXT_MAP, mask=pa.array(counts == 0))


def _raw_values(body: bytes, names: tuple[str, ...], rows: int | None, others: tuple[str, ...] = ()) -> list[list[msgspec.Raw | None]] | None:
    """Each of the body's `rows` events' value of each of `names` (top-level fields), as its JSON
    text (msgspec's Raw: the value's bytes in the body, found by msgspec's parser without making
    the value), None where the event lacks the field; None where msgspec reads the body as other
    than that many JSON objects (pyarrow read it: never so, but then not sure; `rows` None: any
    number). `others`: the only other fields an event may hold (None where one holds another)."""
    try:
        events = _fields_decoder((*names, *others), only=bool(others)).decode_lines(body)
    except msgspec.DecodeError:  # (msgspec's ValidationError, another field, is one)
        return None
    if rows is not None and len(events) != rows:
        return None
    return [list(map(operator.attrgetter(f"f{index}"), events)) for index in range(len(names))]


@lru_cache(maxsize=64)
def _fields_decoder(names: tuple[str, ...], only: bool = False) -> msgspec.json.Decoder:
    """A decoder of NDJSON lines keeping only `names`' values, each as its text (msgspec.Raw); the
    other fields are parsed past, not made, or (`only`) refused (a ValidationError)."""
    fields = msgspec.defstruct("Fields", [(f"f{index}", msgspec.Raw, None) for index in range(len(names))],
                               rename={f"f{index}": name for index, name in enumerate(names)}, forbid_unknown_fields=only, gc=False)
    return msgspec.json.Decoder(fields)


def _value_copies(raws: list[msgspec.Raw | None], column: pa.Array) -> pa.Array | None:
    """Each event's object or list (`column`, as pyarrow read it; `raws`, its text in the body) as
    its copy in the extra_fields map: the text without the whitespace between its tokens, where
    that copy is sure to be Jackson's (_JsonLayout.span_texts, over the values' texts alone,
    joined); None where most are not. A thousand events' pods (four keys and their labels) cost
    ~0.5 ms this way against ~1.6 finding each in the whole body by numpy (_JsonLayout's passes
    over all of its bytes) and ~20 reading each line again by Python's json."""
    valid = None if column.null_count == 0 else column.is_valid().to_numpy(zero_copy_only=False)
    taken = raws if valid is None else [raws[row] for row in np.flatnonzero(valid).tolist()]
    if None in taken:
        return None  # (pyarrow read a value there: never so)
    lengths = np.fromiter(map(len, taken), np.int64, count=len(taken))
    ends = np.cumsum(lengths)
    layout = _JsonLayout(b"".join(taken))
    decode = json.JSONDecoder(object_pairs_hook=tuple).decode
    texts = layout.span_texts(ends - lengths, ends, lambda index: extra_text(decode(bytes(taken[index]).decode())))
    if texts is None or valid is None:
        return texts
    at = np.full(len(valid), -1)
    at[valid] = np.arange(len(taken))
    return texts.take(pa.array(at, mask=~valid))


class Lines(Sequence):
    """A body's non-blank lines (`line.strip()`), split only when one is asked for: most bodies'
    lines never are (pyarrow reads a body at once), and splitting costs a task ~0.14 ms per 1,000
    events, 5% of a plain body's whole reading and writing. Counted by numpy where every line
    starts with a brace (none can then be blank), ~0.05 ms, and then split without looking at
    each line (~0.1 ms less)."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self._lines: list[bytes] | None = None
        self._count: int | None = None
        self._braced: bool | None = None  # whether every line starts with a brace, once looked at

    def braced(self) -> bool:
        """Whether every line starts with a brace (none is blank), counting them if so."""
        if self._braced is None:
            data = np.frombuffer(self.body, np.uint8)
            newlines = np.flatnonzero(data == ord("\n"))
            if len(newlines) and newlines[-1] == len(data) - 1:  # a last newline ends the last line
                newlines = newlines[:-1]
            self._braced = bool(len(data) and data[0] == ord("{") and (data[newlines + 1] == ord("{")).all())
            if self._braced:
                self._count = len(newlines) + 1
        return self._braced

    def __len__(self) -> int:
        if self._count is None and not self.braced():
            self._count = len(self.lines)
        return self._count

    def __getitem__(self, index):  # noqa: ANN001, ANN204 - as list's
        return self.lines[index]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.lines)

    @property
    def lines(self) -> list[bytes]:
        if self._lines is None:
            pieces = self.body.split(b"\n")
            if self.braced():
                self._lines = pieces[:-1] if not pieces[-1] else pieces  # (a last newline ends the last line)
            else:
                self._lines = [line for line in pieces if line.strip()]
        return self._lines


def any_line_holds(lines: Sequence[bytes], rows: np.ndarray, text: bytes) -> bool:
    """Whether a line of `rows` holds `text`: a body's lines (Lines) are looked at whole first, so
    a body without it costs one search, not one per row (labels of a few keys each, where most
    objects lack one: 0.8 of a task's 4 ms per 1,000 events were spent looking at each line)."""
    if not len(rows) or (isinstance(lines, Lines) and text not in lines.body):
        return False
    return any(text in lines[row] for row in rows.tolist())


def _is_nested(type_: pa.DataType) -> bool:
    return pa.types.is_struct(type_) or pa.types.is_list(type_)


class _JsonLayout:
    """Where a body's JSON strings and brackets are, found by numpy's searches for single bytes
    (no step per byte in Python, and no pass over the whole body but those searches): each quote
    not escaped (by an odd run of backslashes) opens or closes a string, and each bracket outside
    strings has a depth. Its data is a body (unknown_fields: each event's keys and values) or
    values' texts joined (_value_copies). span_texts takes values as Spark's JSON functions copy
    them into the extra_fields map (Jackson's compact copy, extra_text's): their bytes without
    the whitespace between tokens, where that copy is sure to be those bytes."""

    def __init__(self, text: bytes) -> None:
        self.text = text
        self.data = data = np.frombuffer(text, np.uint8)
        quotes = np.flatnonzero(data == ord('"'))
        self.backslashes = np.flatnonzero(data == ord("\\"))
        if len(self.backslashes) and len(quotes):
            # A quote after an odd run of backslashes is escaped: the run ends where the last other byte is.
            backslash = data == ord("\\")
            last_other = np.maximum.accumulate(np.where(backslash, -1, np.arange(len(data))))
            before = np.maximum(quotes - 1, 0)
            run = np.where(quotes > 0, before - last_other[before], 0)
            quotes = quotes[run % 2 == 0]
        self.quotes = quotes
        self.nesting: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # the brackets, each one's step and the depth after it
        self.newlines: np.ndarray | None = None  # found once a line is read again
        self.spaces: np.ndarray | None = None  # the whitespace between tokens, found once a copy needs it
        self.lines_read: dict[int, tuple] = {}  # each line read again, by its number in the body

    @property
    def brackets(self) -> np.ndarray:
        """Where each bracket outside strings is (found once asked: copying values does not ask)."""
        return self._nesting()[0]

    @property
    def step(self) -> np.ndarray:
        """Each bracket's step in depth: 1 opening, -1 closing."""
        return self._nesting()[1]

    @property
    def depth(self) -> np.ndarray:
        """The depth after each bracket."""
        return self._nesting()[2]

    def _nesting(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        # (Not functools.cached_property: Python 3.11's holds a lock, which the task's code, pickled by value, cannot.)
        if self.nesting is None:
            data = self.data
            brackets = np.flatnonzero((data == ord("{")) | (data == ord("}")) | (data == ord("[")) | (data == ord("]")))
            brackets = brackets[self.outside(brackets)]
            step = np.where((data[brackets] == ord("{")) | (data[brackets] == ord("[")), 1, -1)
            self.nesting = (brackets, step, np.cumsum(step))
        return self.nesting

    def outside(self, places: np.ndarray) -> np.ndarray:
        """Whether each place is outside strings (a closing quote is; an opening one is not)."""
        return np.searchsorted(self.quotes, places, side="right") % 2 == 0

    def unknown_fields(self, known: list[str], rows: int) -> pa.MapArray | None:
        """extra_maps's answer read from the layout alone, for events whose fields the table lacks
        pyarrow could not infer as columns (a field now a number, now text; more than
        MANY_INFERRED of them): each top-level key of an event (a string at depth 1 followed by
        a colon) outside `known`, with its value's text: a string's own (read again where it
        holds an escape), a number's as written (read again where Java spells it otherwise), true
        or false, an object's or a list's copy; a null none. None where not sure: a key with an
        escape, a key twice in an event, an event that is no object, most values read again."""
        import pyarrow.compute as pc

        data, quotes = self.data, self.quotes
        if (keys := self._top_keys(rows)) is None:
            return None
        names, row, colons = keys
        codes = pc.dictionary_encode(names)
        if _twice(row * len(codes.dictionary) + codes.indices.to_numpy(zero_copy_only=False), rows * len(codes.dictionary)):
            return None  # a key twice in an event: extra_text's reading refuses it
        unknown = ~pc.is_in(names, value_set=pa.array(known, pa.string())).to_numpy(zero_copy_only=False)
        starts = self._past_spaces(colons[unknown] + 1)
        if starts is None:
            return None
        first = data[starts]
        held = first != ord("n")  # a null: no entry
        starts, first, names, row = starts[held], first[held], names.filter(pa.array(unknown)).filter(pa.array(held)), row[unknown][held]
        if not len(starts):
            return pa.nulls(rows, TEXT_MAP)
        strings = first == ord('"')
        nested = (first == ord("{")) | (first == ord("["))
        ends = self._token_ends(starts)
        if ends is None:
            return None
        if strings.any():
            ends[strings] = quotes[np.searchsorted(quotes, starts[strings], side="right")] + 1
        if nested.any():
            if (closed := self._closings(starts[nested])) is None:
                return None
            ends[nested] = closed
        named = names.to_pylist()
        texts = self.span_texts(starts, ends, lambda index: self._read_again(int(starts[index]), named[index]), strings)
        if texts is None:
            return None
        counts = np.bincount(row, minlength=rows)
        offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
        return pa.MapArray.from_arrays(offsets, names, texts, type=TEXT_MAP, mask=pa.array(counts == 0))

    def _top_keys(self, rows: int) -> tuple[pa.Array, np.ndarray, np.ndarray] | None:
        """Each top-level key of the `rows` events (a string at depth 1 followed by a colon):
        its name, its event's row and its colon's place; None where an event is no object or a
        key is spelled with an escape."""
        data, quotes = self.data, self.quotes
        if len(quotes) % 2:
            return None
        tops = self.brackets[(self.step == 1) & (self.depth == 1)]  # each event's opening brace
        if len(tops) != rows or (data[tops] != ord("{")).any():
            return None
        opening, closing = quotes[0::2], quotes[1::2]
        before = np.searchsorted(self.brackets, opening) - 1
        top = np.where(before >= 0, self.depth[np.maximum(before, 0)], 0) == 1
        opening, closing = opening[top], closing[top]
        colons = self._past_spaces(closing + 1)
        if colons is None:
            return None
        keyed = data[colons] == ord(":")
        opening, closing, colons = opening[keyed], closing[keyed], colons[keyed]
        if len(self.backslashes) and (np.searchsorted(self.backslashes, opening) != np.searchsorted(self.backslashes, closing)).any():
            return None  # a key spelled with an escape
        if (names := _spans(data, opening + 1, closing)) is None:
            return None
        return names, np.searchsorted(tops, opening, side="right") - 1, colons

    def key_rows(self, rows: int, names: list[str] | None = None, known: list[str] | None = None) -> dict[str, set[int]] | None:
        """The rows of the `rows` events holding each of these top-level keys (`names`, or every
        key outside `known`), whatever its value (those held by none left out); None where not
        sure (_top_keys)."""
        import pyarrow.compute as pc

        if (keys := self._top_keys(rows)) is None:
            return None
        found, row, _colons = keys
        if names is None:
            names = pc.unique(found.filter(pc.invert(pc.is_in(found, value_set=pa.array(known or [], pa.string()))))).to_pylist()
        wanted = pa.array(names, pa.string())
        at = pc.fill_null(pc.index_in(found, value_set=wanted), -1).to_numpy(zero_copy_only=False)
        which, row = at[at >= 0], row[at >= 0]
        return {names[k]: set(row[which == k].tolist()) for k in np.unique(which).tolist()}

    def _closings(self, starts: np.ndarray) -> np.ndarray | None:
        """Past the bracket closing each object or list that opens at `starts`; None where one
        does not open there."""
        which = np.searchsorted(self.brackets, starts)
        if (which >= len(self.brackets)).any() or (self.brackets[which] != starts).any() or (self.step[which] != 1).any():
            return None
        levels = self.depth[which] - 1  # the depth its closing bracket returns to
        ends = np.empty_like(starts)
        closing = self.step == -1
        for level in np.unique(levels).tolist():
            same = self.brackets[closing & (self.depth == level)]
            these = levels == level
            found = np.searchsorted(same, starts[these], side="right")
            if (found >= len(same)).any():
                return None
            ends[these] = same[found] + 1
        return ends

    def _token_ends(self, starts: np.ndarray) -> np.ndarray | None:
        """Past each number, true or false beginning at `starts` (any other value ends where it
        begins: its end is found otherwise); None past 40 bytes."""
        data, last = self.data, len(self.data) - 1
        ends = starts.copy()
        for _step in range(41):
            byte = data[np.minimum(ends, last)]
            more = (ends <= last) & (((byte >= ord("0")) & (byte <= ord("9"))) | (byte == ord("-")) | (byte == ord("+"))
                                     | (byte == ord(".")) | ((byte >= ord("a")) & (byte <= ord("z"))) | (byte == ord("E")))
            if not more.any():
                return ends
            ends = ends + more
        return None

    def span_texts(self, starts: np.ndarray, ends: np.ndarray, again: Callable[[int], str], strings: np.ndarray | None = None) -> pa.Array | None:
        """The text of each value [start, end) (in ascending order, apart), as extra_text spells
        it: a copy without the whitespace between tokens, a string's (`strings`) without its
        quotes; read again (`again`, given the value's index) where that is not sure, and None
        where most are."""
        import pyarrow.compute as pc

        data = self.data
        unsure = self._unsure(starts, ends)
        if strings is not None and strings.any():
            if len(self.backslashes):  # a string's escapes are read by json
                span = np.searchsorted(starts, self.backslashes, side="right") - 1
                inside = (span >= 0) & (self.backslashes < ends[np.maximum(span, 0)])
                escaped = np.zeros(len(starts), bool)
                escaped[span[inside]] = True
                unsure |= escaped & strings
            starts, ends = starts + strings, ends - strings
        if unsure.sum() * 4 > len(unsure):
            return None  # most of them: reading every line again costs no more
        if self.spaces is None:  # the whitespace between tokens, dropped: Jackson's copy has none
            text = self.text
            if b" " in text or b"\t" in text or b"\r" in text:  # (memchr's speed: compact JSON has none but in its strings)
                space = np.flatnonzero((data == ord(" ")) | (data == ord("\t")) | (data == ord("\r")))
                self.spaces = space[self.outside(space)]
            else:
                self.spaces = np.empty(0, np.int64)
        sure = ~unsure
        texts = _spans(data, starts, np.where(sure, ends, starts), self.spaces)  # the unsure empty, for now
        if texts is None:
            return None
        if not unsure.any():
            return texts
        # The few values whose copy is not sure (a fraction Java spells in another way, say): their
        # lines read again, as every line would be.
        read = [again(index) for index in np.flatnonzero(unsure).tolist()]
        return pc.replace_with_mask(texts, pa.array(unsure), pa.array(read, pa.string()))

    def _read_again(self, start: int, name: str) -> str:
        """The text of the value of `name` (which begins at `start`) read from its line by
        Python's json, as extra_maps reads every line: Unspellable where it cannot be sure."""
        if self.newlines is None:
            self.newlines = np.flatnonzero(self.data == ord("\n"))
        line = int(np.searchsorted(self.newlines, start))
        if (pairs := self.lines_read.get(line)) is None:  # each line read once, however many of its values are unsure
            begin = int(self.newlines[line - 1]) + 1 if line else 0
            end = int(self.newlines[line]) if line < len(self.newlines) else len(self.data)
            pairs = self.lines_read[line] = json.JSONDecoder(object_pairs_hook=tuple).decode(self.data[begin:end].tobytes().decode())
        value = next((value for key, value in pairs if key == name), None)
        if value is None:  # (pyarrow read one there: never so)
            raise Unspellable(f"the field {name!r} not where it was found")
        return extra_text(value)

    def _after_colon(self, places: np.ndarray) -> np.ndarray | None:
        """Where each key's value begins: past the colon after `places` and the whitespace either
        side of it; None where a byte there is another (or past eight spaces)."""
        places = self._past_spaces(places)
        if places is None or not (self.data[places] == ord(":")).all():
            return None
        return self._past_spaces(places + 1)

    def _past_spaces(self, places: np.ndarray) -> np.ndarray | None:
        """Each place moved past the spaces, tabs and carriage returns at it (None past eight)."""
        for _step in range(9):
            if len(places) and places.max() >= len(self.data):
                return None
            byte = self.data[places]
            space = (byte == ord(" ")) | (byte == ord("\t")) | (byte == ord("\r"))
            if not space.any():
                return places
            places = places + space
        return None

    def _unsure(self, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Whether each span [start, end) holds a byte whose copy is not sure to be itself: an
        exponent, or a fraction Java's Double.toString spells otherwise (_respelled), -0 (an
        integer's 0; -0.5 is a fraction), NaN or Infinity (Python's json reads them, no copy
        spells them), a \\u or \\/ escape (Jackson writes the character), a character beyond the
        Basic Multilingual Plane (Jackson's surrogate escapes) or a control character in a string
        (json refuses it). Only the spans' bytes are searched where they are under half of those
        from the first span to the last (objects among other fields: ~10% less for extra_maps)."""
        data = self.data
        unsure = np.zeros(len(starts), bool)

        def spans_of(places: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            """The places inside spans, and the span each is in."""
            span = np.searchsorted(starts, places, side="right") - 1
            inside = (span >= 0) & (places < ends[np.maximum(span, 0)])
            return places[inside], span[inside]

        def mark(places: np.ndarray) -> None:
            unsure[spans_of(places)[1]] = True

        first, last = int(starts[0]), int(ends[-1])
        lengths = ends - starts
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        if offsets[-1] * 2 > last - first:  # the spans are most of the bytes from the first to the last: those are searched
            inner, where = data[first:last], None
        else:  # only the spans' bytes (an object among an event's other fields, say)
            where = np.arange(offsets[-1]) + np.repeat(starts - offsets[:-1], lengths)
            inner = data[where]

        def places_of(hit: np.ndarray) -> np.ndarray:
            """Where in data the bytes `hit` (a mask over `inner`) are."""
            at = np.flatnonzero(hit)
            return at + first if where is None else where[at]

        def found(*bytes_: int) -> np.ndarray:
            hit = inner == bytes_[0]
            for byte in bytes_[1:]:
                hit |= inner == byte
            return places_of(hit)

        exponents = found(ord("e"), ord("E"))
        exponents = exponents[(data[exponents - 1] >= ord("0")) & (data[exponents - 1] <= ord("9"))]
        minus = found(ord("-"))
        minus = minus[(data[np.minimum(minus + 1, len(data) - 1)] == ord("0")) & (data[np.minimum(minus + 2, len(data) - 1)] != ord("."))]
        outside = np.concatenate([found(ord("N"), ord("I")), exponents, minus])
        mark(outside[self.outside(outside)])
        control = places_of(inner < 0x20)
        mark(control[~self.outside(control)])
        mark(places_of(inner >= 0xF0))
        escapes = self.backslashes[(self.backslashes >= first) & (self.backslashes < last)]
        if len(escapes):
            escaped = data[escapes + 1]
            mark(escapes[(escaped == ord("u")) | (escaped == ord("/"))])
        points = found(ord("."))
        points, span = spans_of(points[self.outside(points)])
        if len(points):
            unsure[span[self._respelled(points)]] = True
        return unsure

    def _respelled(self, points: np.ndarray) -> np.ndarray:
        """Whether each number with a fraction (the point of each, outside strings) may be copied
        otherwise than it is written: Java's Double.toString spells a double from 1e-3 to 1e7 by
        its shortest digits, which are pyarrow's there (checked as _extra_double_texts says), with
        at least one after the point (12.50 is respelled 12.5, 0.0001 1.0E-4)."""
        import pyarrow.compute as pc

        data, last = self.data, len(self.data) - 1
        every = np.ones(len(points), bool)
        begin, end = points.copy(), points + 1
        for _step in range(24):
            before = data[np.maximum(begin - 1, 0)]
            more = (begin > 0) & (((before >= ord("0")) & (before <= ord("9"))) | (before == ord("-")))
            if not more.any():
                break
            begin = begin - more
        else:
            return every
        for _step in range(24):
            after = data[np.minimum(end, last)]
            more = (end <= last) & (after >= ord("0")) & (after <= ord("9"))
            if not more.any():
                break
            end = end + more
        else:
            return every
        try:
            values = pc.cast(written := _spans(data, begin, end), pa.float64())  # (digits: UTF-8, never None)
        except pa.ArrowInvalid:
            return every
        x = values.to_numpy(zero_copy_only=False)
        shortest = pc.cast(values, pa.string())
        whole = pa.array(x == np.trunc(x))  # 5.0: pyarrow writes 5, Java 5.0
        spelled = pc.if_else(whole, pc.binary_join_element_wise(shortest, ".0", ""), shortest)
        same = pc.equal(spelled, written).to_numpy(zero_copy_only=False)
        return ~(same & (np.abs(x) >= 1e-3) & (np.abs(x) < 1e7))


def _spans(data: np.ndarray, starts: np.ndarray, ends: np.ndarray, dropped: np.ndarray | None = None) -> pa.Array | None:
    """The texts data[start:end], one for each, without the bytes at the places `dropped`
    (ascending); None where one is no UTF-8."""
    lengths = ends - starts
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    whole = dropped is None or not len(dropped)  # no byte of the spans left out
    if whole and len(starts) and starts[0] == 0 and ends[-1] == len(data) and (starts[1:] == ends[:-1]).all():
        # The spans are the data, one after another: their texts are its bytes.
        texts = pa.StringArray.from_buffers(len(starts), pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data))
    elif whole and len(starts) and len(data) < 2**31 and (lengths >= 0).all() and (starts[1:] >= ends[:-1]).all():
        texts = _pieces(data, starts, ends)
    else:
        taken = np.arange(offsets[-1]) + np.repeat(starts - offsets[:-1], lengths)  # each span's bytes, span after span
        if not whole and len(taken):
            marked = np.zeros(len(data), bool)
            marked[dropped] = True
            kept = ~marked[taken]
            taken = taken[kept]
            counted = np.concatenate([[0], np.cumsum(kept)])  # kept bytes before each of the spans' bytes
            offsets = counted[offsets]
        texts = pa.StringArray.from_buffers(len(starts), pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data[taken].tobytes()))
    try:
        texts.validate(full=True)  # UTF-8, as json would read it
    except pa.ArrowInvalid:
        return None
    return texts


def _twice(pairs: np.ndarray, kinds: int) -> bool:
    """Whether a value of `pairs` (each below `kinds`) is there twice: counted where the kinds are
    few beside the pairs (each event's keys: a wide event's thirty-odd, ~0.1 ms per 1,000 events
    against ~1.7 sorting them), sorted where not."""
    if kinds <= 4 * len(pairs) + 4096:
        return bool(len(pairs)) and int(np.bincount(pairs, minlength=kinds).max()) > 1
    pairs = np.sort(pairs)
    return bool((pairs[1:] == pairs[:-1]).any())


def _pieces(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> pa.Array:
    """The texts data[start:end] of spans in ascending order and apart (not checked as UTF-8):
    the spans and the gaps between them are the pieces of one array over `data` itself, of which
    pyarrow's take copies every other. _spans's gather of each byte's place by numpy cost a wide
    event's task ~5 ms per 1,000 events for its keys and values; this, ~1."""
    offsets = np.empty(2 * len(starts), np.int32)
    offsets[0::2], offsets[1::2] = starts, ends
    pieces = pa.StringArray.from_buffers(len(offsets) - 1, pa.py_buffer(offsets), pa.py_buffer(data))
    return pieces.take(pa.array(np.arange(0, len(offsets) - 1, 2)))


def _extra_double_texts(values: pa.Array, name: str, body: bytes, keys_at: Callable[[str, int], np.ndarray | None]) -> pa.Array | None:
    """A field pyarrow read as doubles, each value as extra_text spells the number its event
    holds (None where not sure). A fraction from 1e-3 to 1e7 by pyarrow's shortest digits, which
    are Java's Double.toString's there (java_double's: checked equal on 400,000 values); a whole
    number by its text, found after its key (`keys_at`): an integer's digits as written (pyarrow
    reads 1 and 1.0 alike, and any integer beyond a long as a double), a double's by java_double;
    any other by java_double. (Java's spelling, as Spark's JSON functions copy a number: not
    otlp_columns._double_texts, which spells doubles as orjson writes them.)"""
    import pyarrow.compute as pc

    x = values.to_numpy(zero_copy_only=False)  # NULL as NaN
    valid = values.is_valid().to_numpy(zero_copy_only=False)
    with np.errstate(invalid="ignore"):
        whole = valid & (x == np.trunc(x))
        shortest = valid & ~whole & (np.abs(x) >= 1e-3) & (np.abs(x) < 1e7)
    texts = pc.cast(values, pa.string())
    if not (others := np.flatnonzero(valid & ~shortest)).size:
        return texts
    integers: dict[int, str] = {}  # the whole numbers written as integers, by row
    if whole.any():
        if (at := keys_at(name, int(valid.sum()))) is None:
            return None
        after = at[np.cumsum(valid)[whole] - 1] + len(name) + 2  # each whole number's key's end
        for row, place in zip(np.flatnonzero(whole).tolist(), after.tolist(), strict=True):
            if (number := _NUMBER_AFTER_KEY.match(body, place)) is None:
                return None
            if (text := number.group(1)).lstrip(b"-").isdigit():  # no fraction, no exponent
                integers[row] = str(int(text))
    mask = np.zeros(len(x), dtype=bool)
    mask[others] = True
    spelled = [integers[row] if row in integers else java_double(float(x[row])) for row in others.tolist()]
    return pc.replace_with_mask(texts, pa.array(mask), pa.array(spelled, pa.string()))


def places(data: np.ndarray, text: bytes) -> np.ndarray:
    """Where `text` (two bytes or more) starts in `data` (a body's bytes as numpy's uint8, not
    copied), every place in ascending order, overlapping ones too: as `bytes.find` from each place
    found plus one would say, without a Python step per place (a thousand events' two keys cost
    ~0.55 ms that way, ~0.25 ms this). Its second byte is looked for first (a key's first is a
    quote, as are a fifth of a body's bytes), then each other byte at the places left."""
    if len(data) < len(text):
        return np.empty(0, np.int64)
    found = np.flatnonzero(data[1:len(data) - len(text) + 2] == text[1])
    for offset, byte in enumerate(text):
        if offset != 1:
            found = found[data[found + offset] == byte]
    return found


def _appender(directory: str, filesystem, parsing: pa.Schema, file_schema: pa.Schema, required: frozenset[str],  # noqa: ANN001
              extra_fields: str | None = None, partition: list[tuple[str, str]] | None = None, changes: bool = False,
              entries: StreamEntries | None = None, by_request: bool = False, processors: tuple[list[tuple], list[str]] | None = None,
              target_file_size: int | None = None, text_nulls: bool = False) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The short way's task for one sink, from append_directly's arguments (the tests build one so)."""
    sink = sink_arguments(directory, filesystem, parsing, file_schema, required, extra_fields, partition or (), changes, processors,
                          target_file_size, text_nulls)
    return _task([sink], entries, by_request)


def _task(sinks: list[tuple], entries: StreamEntries | None, by_request: bool) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """`_append` for `sinks` (sink_arguments each), its code pickled once per process (task_code.py).
    Where the bodies are goes as plain data (StreamEntries' class would be pickled by value again),
    without the ids, which the job's rows hold."""
    where = None if entries is None else (entries.url, entries.cluster, entries.stream)
    return bound(_append, sinks, where, by_request)


class BodyReader:
    """A short-way task's reading of its requests' bodies into rows of the table (rows_of), as
    _append's arguments say, and what the task learnt of its bodies on the way: a logger sends
    every body alike, so the way the last body read goes first for the next (number_texts,
    split_last, epoch_order, wide_maps). One per task, in its Python worker."""

    def __init__(self, parsing: pa.Schema, file_schema: pa.Schema, required: frozenset[str], extra_fields: str | None,
                 partition: list[tuple[str, str]] | None, changes: bool, processors: tuple[list[tuple], list[str]] | None,
                 text_nulls: bool, dropping: str | None = None) -> None:
        self.parsing, self.file_schema, self.extra_fields, self.processors = parsing, file_schema, extra_fields, processors
        self.kinds = {f.name: kind for f in file_schema if f.name in parsing.names and (kind := time_kind(f.type))}
        self.binary = [f.name for f in file_schema if f.name in parsing.names and is_binary(f.type)]
        self.decimal = decimal_paths(parsing)
        self.maps = [f.name for f in file_schema if f.name != extra_fields and is_text_map(f.type)]
        # Renamed columns parsed by their old names (each the new name's type), renamed after the parse.
        self.renames = renamed(processors[0]) if processors is not None else {}
        names = {new: old for old, new in self.renames.items()}
        self.reading = pa.schema([f.with_name(names.get(f.name, f.name)) for f in parsing])
        # Time columns as JSON integers (epoch milliseconds or days) instead of text.
        self.epoch_reading = pa.schema([pa.field(f.name, pa.int64()) if original.name in self.kinds else f
                                        for f, original in zip(self.reading, parsing)])
        self.known = [*parsing.names, *self.maps]
        sources = {source for source, _transform in partition or ()}
        # Number columns whose values may come as text (append_directly's text_nulls), and of those
        # the optional ones whose text that cannot be a number reads as NULL (a required column's
        # NULL is the DLQ's, a partition source's the Spark job's to place).
        self.text_as_number = frozenset(f.name for f in parsing if text_nulls and f.name not in self.kinds
                                        and (pa.types.is_integer(f.type) or pa.types.is_floating(f.type)))
        self.text_as_null = frozenset(name for name in self.text_as_number if name not in required and name not in sources)
        self.integer_columns = frozenset(name for name in self.text_as_number if pa.types.is_integer(parsing.field(name).type))
        # Text columns whose values may come as integers (ids sent as numbers): each spelled as its digits.
        self.text_columns = frozenset(f.name for f in parsing if text_nulls and f.name not in self.kinds
                                      and (pa.types.is_string(f.type) or pa.types.is_large_string(f.type)))
        # Boolean columns whose values may come as text, and of those the ones whose other text reads as NULL.
        self.flag_columns = frozenset(f.name for f in parsing if text_nulls and pa.types.is_boolean(f.type))
        self.flag_as_null = frozenset(name for name in self.flag_columns if name not in required and name not in sources)
        # A table that takes an OTLP export's columns as they are: each is one of its columns, and
        # nothing renames, drops or computes columns or keeps unknown fields (otlp_rows.ROWS).
        self.takes_rows = processors is None and not extra_fields and not changes and set(ROWS.names) <= set(file_schema.names)
        self.columnar = False  # whether some request came as columns
        self.drops = dropped(processors[0]) if processors is not None else frozenset()  # fields the table lacks, left out
        # A field in other letter case of any name a drop names (Spark's drop takes it too) refuses its request.
        self.folded_drops = {name.casefold() for name in self.drops | (nulled(processors[0]) if processors is not None else frozenset())}
        self.folded_renames = {name.casefold() for pair in self.renames.items() for name in pair}
        self.nested = [f.name for f in parsing if is_nested(f.type)]
        # Each nested column's type once its maps of strings are made (nested_text_maps): those with maps, and the others as parsed.
        self.nested_types = {name: nested_parsing(file_schema.field(name).type, read=False) for name in self.nested}
        self.nested_maps = [name for name in self.nested if has_nested_maps(file_schema.field(name).type)]
        # Fields the table lacks left out and named (append_directly's dropping; dropped_fields),
        # where nothing else reads them: no extra_fields, processors, row changes or maps (a key
        # an object's struct column lacks still refuses its request: the full job names it).
        self.dropping = dropping if not extra_fields and processors is None and not changes and not self.maps and not self.nested_maps else None
        self.dropped_rows: dict[str, set[int]] = {}  # the body's rows holding each field it left out, by name (dropped_fields)
        self.wide_maps = False  # True once a body's maps had many keys
        self.layout_memory = FallbackMemory()  # the layout for fields the table lacks (extra_maps)
        self.infer_memory = FallbackMemory()  # inferring fields the table lacks (read_fields)
        # Wide events: the last body held more fields the table lacks than extra_maps asks column
        # by column, so its maps came from the layout and inferring their columns was for nothing.
        self.wide_memory = FallbackMemory()
        # The fields the table lacks that the task's last body held, where each was an object (or
        # null) wherever sent: the next body's are read as objects without inferring their keys (read_objects).
        self.object_fields: tuple[str, ...] = ()
        self.object_texts: tuple[bytes, dict[str, list[msgspec.Raw | None]]] | None = None  # (the body, its object_fields' texts)
        # Reading object_fields so (read_objects): a body that had another field cost ~0.4 ms more (msgspec's
        # look, wasted), so a producer whose bodies now and then hold one is tried but once in 33 bodies.
        self.objects_memory = FallbackMemory(skipped=32)
        # The columns the task's last body sent otherwise than their types (read_numbers's sets): numbers
        # as text, as doubles, as integers, booleans as text, as numbers, numbers with a fraction as text.
        self.number_texts: tuple[frozenset[str], ...] | None = None
        self.split_last = False  # whether the task's last body was read by read_split and held numbers (or booleans, objects, lists) in a text column
        # A text column's name before a number (or a boolean, an object, a list: the first letter of
        # true or false, a brace or a bracket), as JSON writes it: where the body after such a one has
        # none, it is read as one, not in groups (a search a fifth of a read's cost on a plain body).
        # A nested field of the name matches too, and a name spelled with escapes does not: either way
        # pyarrow's reads decide. Past MAX_SPLIT_NAMES text columns no search (each name is tried in turn).
        self.odd_in_text = _names_before(self.text_columns, rb"[-0-9tf{[]", b"-0123456789tf{[")
        # A number column's name before text: searched for only where the body is known to hold
        # such text, or the task's last body did (quoted_last), as the search costs about as much
        # as the one above (a third of a microsecond an event).
        self.text_in_number = _names_before(self.text_as_number, b'"', b'"')
        self.quoted_last = False  # whether the task's last body read by read_split held text in a number column
        self.text_names = {_json_key(name)[1:-1]: name for name in self.text_columns}  # (as odd_in_text finds them)
        self.nulled_rows: dict[str, set[int]] = {}  # the body's rows whose value a conversion made NULL, by column (read_texts)
        self.epoch_order = (False, True)  # time columns as text first, as epoch numbers next; the way that read last goes first

    def read(self, body: bytes, unexpected: str, epoch: bool, shells: bool = False, as_read: dict[str, pa.DataType] | None = None,
             objects: tuple[str, ...] = ()) -> pa.Table:
        import pyarrow.json as pj

        schema = self.epoch_reading if epoch else self.reading
        if as_read:  # columns read as another type than their own (numbers as text, ...), converted after
            schema = pa.schema([f.with_type(as_read[f.name]) if f.name in as_read else f for f in schema])
        if shells or objects:  # the maps (and `objects`) as empty structs: which events have an object, its keys not inferred
            schema = pa.schema([*schema, *(pa.field(name, pa.struct([])) for name in [*(self.maps if shells else ()), *objects])])
        options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior=unexpected)
        # One block, on this thread: pyarrow's thread pool parses one block no faster, and its hand-offs cost the worker
        # CPU (measured in one process: a body's whole parse 17-35% less CPU this way over seven of make bench's shapes).
        return pj.read_json(io.BytesIO(body), read_options=pj.ReadOptions(use_threads=False, block_size=len(body) + 1), parse_options=options)

    def read_fields(self, body: bytes, epoch: bool, as_read: dict[str, pa.DataType] | None = None, whole: bool = False) -> tuple[pa.Table, bool]:
        """(the body's table, whether every line must be read for the fields the table lacks).
        whole: the read is of a whole body (not of some of its lines, whose parts must agree),
        so where the task's last bodies held a field of changing type (infer_memory), the fields
        the table lacks are not inferred but read from every line, as that field makes them."""
        if self.wide_maps:
            return self.read(body, "ignore", epoch, shells=True, as_read=as_read), True
        # (Where every line is read, the fields the table lacks are as inferring them gives: but
        # maps, processors and nested columns refuse a body with every_line; not so remembered.)
        plain = self.extra_fields and not self.maps and not self.nested and self.processors is None
        if whole and plain and (not self.infer_memory.worth_trying() or not self.wide_memory.worth_trying()):
            return self.read(body, "ignore", epoch, as_read=as_read), True
        if whole and plain and self.object_fields and self.objects_memory.worth_trying() and (table := self.read_objects(body, epoch, as_read)) is not None:
            return table, False
        try:
            # Fields the table lacks inferred as columns: which events have any (and the maps
            # of strings as structs: which events have one).
            unexpected = "infer" if self.extra_fields or self.maps or self.drops or self.nested_maps or self.dropping else "error"
            return self.read(body, unexpected, epoch, as_read=as_read), False
        except pa.ArrowInvalid as exc:
            if ((not self.extra_fields and self.dropping != DROP_KEYS) or self.maps or self.mistyped(exc) or _FRACTION_FOR_INTEGER.search(str(exc))
                    or _number_for_text(exc, self.text_columns)
                    or _other_for_text(exc, self.text_columns) or _text_for_flag(exc, self.flag_columns) or _number_for_flag(exc, self.flag_columns)):
                raise
            # Such a field of changing type cannot be inferred: every line is looked at.
            if whole and plain:
                self.infer_memory.gave_up()
            return self.read(body, "ignore", epoch, as_read=as_read), True

    def read_objects(self, body: bytes, epoch: bool, as_read: dict[str, pa.DataType] | None) -> pa.Table | None:
        """The body read as inferring the fields the table lacks reads it, where those are the
        task's last body's object_fields: each such field an empty struct (which events hold an
        object), its keys not inferred, and every other field the table lacks ignored, once
        msgspec found none in the body (a field outside the table and object_fields, which
        inferring would have kept); its objects' texts kept for extra_maps (object_texts). None,
        and object_fields forgotten, where the body holds another field or such a field as other
        than an object (pyarrow's read then infers them). `make bench`'s `pods` (an object per
        event, copied into the extra_fields map), one process: a body's rows 2.66-2.73 against
        2.86-2.93 ms per 1,000 events (pyarrow's read ~0.4 ms less, msgspec's look at every
        field ~0.15 more); every other body with one field more, 2.89-2.93 either way."""
        names = self.object_fields
        # (A key spelled with an escape: pyarrow's and msgspec's names may differ.)
        texts = None if b"\\" in body and b"\\u" in body else _raw_values(body, names, None, tuple(self.reading.names))
        try:
            table = None if texts is None else self.read(body, "ignore", epoch, as_read=as_read, objects=names)
        except pa.ArrowInvalid:
            table = None
        if table is None or len(texts[0]) != table.num_rows:
            # A producer whose bodies now and then hold another field: the next few are inferred at once.
            self.object_fields = ()
            self.objects_memory.gave_up()
            return None
        self.object_texts = (body, dict(zip(names, texts)))
        return table

    def mistyped(self, exc: pa.ArrowInvalid, columns: frozenset[str] | None = None) -> tuple[str, int] | None:
        """(the column, the row) where pyarrow met text in one of `columns` (text_as_null's)."""
        found = _TEXT_FOR_NUMBER.search(str(exc))
        return (found[1], int(found[2])) if found and found[1] in (self.text_as_null if columns is None else columns) else None

    def stray(self, exc: pa.ArrowInvalid) -> tuple[str, int] | None:
        """(the column, the row) where pyarrow met text in an optional number column (mistyped) or
        a number in a text column: an event read_texts may read alone."""
        if (found := self.mistyped(exc)) is not None:
            return found
        found = _NUMBER_FOR_TEXT.search(str(exc))
        return (found[1], int(found[2])) if found and found[1] in self.text_columns else None

    def read_lines(self, lines: list[bytes], epoch: bool, as_text: Collection[str] = frozenset(),
                   as_number: Collection[str] = frozenset()) -> tuple[pa.Table, bool]:
        table, every_line = self.read_fields(b"\n".join(lines), epoch, {**dict.fromkeys(as_text, pa.string()), **dict.fromkeys(as_number, pa.float64())})
        if table.num_rows != len(lines):
            raise pa.ArrowInvalid(f"{len(lines)} events read as {table.num_rows} rows")
        return table, every_line

    def read_numbers(self, body: bytes, epoch: bool, as_text: frozenset[str], as_double: frozenset[str] = frozenset(),
                     as_integer: frozenset[str] = frozenset(), as_flag: frozenset[str] = frozenset(),
                     flag_numbers: frozenset[str] = frozenset(), spelled: frozenset[str] = frozenset()) -> tuple[pa.Table, bool]:
        """read_fields with the number columns `as_text` read as text (and any other found with
        text on the way), converted by numbers_from_text; the integer columns `as_double` read as
        doubles (all of them, once a number with a fraction or an exponent is found in one),
        converted by integers_from_doubles; the text columns `as_integer` read as integers (and
        any other found with a number on the way), spelled as their digits, or, once a number
        with a fraction or an exponent is found in one (and those `spelled`), read as doubles
        and spelled by spelled_numbers; the boolean columns
        `as_flag` read as text (and any other found with text on the way), converted by
        flags_from_text, and those `flag_numbers` read as integers (and any other found with a
        number on the way), converted by flags_from_numbers. They are the task's next body's first
        try. pa.ArrowInvalid where a column holds numbers and text alike, and once the body was
        read REREAD_TIMES + 1 times (each read finds one more such column: a body built to find
        one per read would cost a task a read per column)."""
        for _read in range(REREAD_TIMES + 1):
            as_read = {**dict.fromkeys(as_double - as_text, pa.float64()), **dict.fromkeys(as_text | as_flag, pa.string()),
                       **dict.fromkeys((as_integer - spelled) | flag_numbers, pa.int64()), **dict.fromkeys(spelled, pa.float64())}
            try:
                table, every_line = self.read_fields(body, epoch, as_read, whole=True)
                break
            except pa.ArrowInvalid as exc:
                found, number = self.mistyped(exc, self.text_as_number), _number_for_text(exc, self.text_columns)
                flag, flag_number = _text_for_flag(exc, self.flag_columns), _number_for_flag(exc, self.flag_columns)
                if found is None and number is None and flag is None and as_integer - spelled and _FRACTION_FOR_INTEGER.search(str(exc)):
                    spelled |= as_integer  # (pyarrow's error names no column: a text column's numbers are tried first)
                elif found is None and number is None and flag is None and not as_double and _FRACTION_FOR_INTEGER.search(str(exc)):
                    as_double = self.integer_columns
                elif number is not None and number not in as_integer:
                    as_integer |= {number}
                elif flag is not None and flag not in as_flag | flag_numbers:
                    as_flag |= {flag}
                elif flag_number is not None and flag_number not in as_flag | flag_numbers:
                    flag_numbers |= {flag_number}
                elif found is None or found[0] in as_text:
                    raise
                else:
                    as_text |= {found[0]}
        else:
            raise pa.ArrowInvalid(f"numbers and text of other columns than the table's types, found one a read past {REREAD_TIMES + 1} reads")
        import pyarrow.compute as pc

        made_null: dict[str, pa.Array] = {}
        table = numbers_from_text(table, {name: self.reading.field(name).type for name in sorted(as_text)}, self.text_as_null, made_null)
        table = integers_from_doubles(table, {name: self.reading.field(name).type for name in sorted(as_double - as_text)})
        for name in sorted(as_integer - spelled):  # an integer in a text column is its digits, as the Spark job spells it
            table = table.set_column(table.schema.get_field_index(name), name, table.column(name).cast(self.reading.field(name).type))
        if spelled:
            lines = [line for line in body.split(b"\n") if line.strip()]
            if len(lines) != table.num_rows:
                raise pa.ArrowInvalid(f"{len(lines)} events read as {table.num_rows} rows")
            events = cache(lambda row: exact_numbers(json_event(lines[row]), lines[row], spelled))
            for name in sorted(spelled):
                table = self.spelled_column(table, name, events)
        table = flags_from_text(table, sorted(as_flag), self.flag_as_null, made_null)
        table = flags_from_numbers(table, sorted(flag_numbers), self.flag_as_null, made_null)
        self.number_texts = (as_text, as_double, as_integer, as_flag, flag_numbers, spelled)
        self.nulled_rows.update({name: set(pc.indices_nonzero(mask).to_pylist()) for name, mask in made_null.items()})
        return table, every_line

    def read_texts(self, body: bytes, epoch: bool) -> tuple[pa.Table, bool]:
        """read_fields, but where a body sends an optional number column's values as text (every
        one of them, as grok's captures and some loggers do), those are read as text and
        converted (read_numbers); and where an event's value there is text that cannot be a
        number (may_read_as_number) amid numbers, that event is read alone, and the value is
        NULL, as the full job converts it (coerce.scalar), instead of its request being left out
        (make bench's `dirty`: one event in 50,000 with "slow" for a double sent its request to
        the Spark job, a job for most batches). The events before it are read again (pyarrow's
        error says where it stopped, not what it read), so a body with such an event is read
        about twice; past MAX_MISTYPED such events, or once the body's bytes were read again
        REREAD_TIMES times (such events spread over a large body: each stop reads the rest
        again), the request is the Spark job's: one tenant's body costs a task a bounded share.
        The rows whose values it made NULL: in nulled_rows, by column."""
        self.nulled_rows.clear()
        if self.split_last:  # the task's last body held numbers and text in a text column: so may this one
            if (self.odd_in_text is not None and self.odd_in_text.search(body) is None
                    and not (self.quoted_last and (self.text_in_number is None or self.text_in_number.search(body)))):
                self.split_last = False  # (no text column's name before a number: a plain body, read as one)
            else:
                try:
                    return self.read_split(Lines(body).lines, epoch, first=True, numbers=self.quoted_last)
                except pa.ArrowInvalid:
                    self.split_last = False
        if self.number_texts:  # the task's last body sent numbers as text (or fractions for integers): so may this one
            try:
                return self.read_numbers(body, epoch, *self.number_texts)
            except pa.ArrowInvalid:
                self.number_texts = None
        try:
            return self.read_fields(body, epoch, whole=True)
        except pa.ArrowInvalid as exc:
            if self.integer_columns and _FRACTION_FOR_INTEGER.search(str(exc)):
                try:  # integers as 12.0 or 1e3 (pandas writes an integer column holding a NaN so)
                    return self.read_numbers(body, epoch, frozenset(), self.integer_columns)
                except pa.ArrowInvalid:
                    raise exc from None
            number = _number_for_text(exc, self.text_columns)
            if number is not None:
                try:  # integers in a text column (ids sent as numbers)
                    return self.read_numbers(body, epoch, frozenset(), frozenset(), frozenset({number}))
                except pa.ArrowInvalid:
                    pass  # numbers and text in one text column: the events with a number are read alone (below)
            elif _other_for_text(exc, self.text_columns) is not None:
                try:  # booleans, objects and lists in a text column (a message now text, now an object): copied as text
                    return self.read_split([line for line in body.split(b"\n") if line.strip()], epoch)
                except pa.ArrowInvalid:
                    raise exc from None
            elif (flag := _text_for_flag(exc, self.flag_columns)) is not None:
                try:  # booleans as text ("true", "yes": a logger that writes every value as a string)
                    return self.read_numbers(body, epoch, frozenset(), frozenset(), frozenset(), frozenset({flag}))
                except pa.ArrowInvalid:
                    raise exc from None
            elif (flag := _number_for_flag(exc, self.flag_columns)) is not None:
                try:  # booleans as 1 and 0
                    return self.read_numbers(body, epoch, frozenset(), frozenset(), frozenset(), frozenset(), frozenset({flag}))
                except pa.ArrowInvalid:
                    raise exc from None
            elif not self.text_as_number or self.mistyped(exc, self.text_as_number) is None:
                raise
            first = exc
        lines = [line for line in body.split(b"\n") if line.strip()]
        if (found := self.mistyped(first, self.text_as_number)) is not None and (as_text := self.numbers_as_text(lines, found[1])):
            try:
                return self.read_numbers(body, epoch, as_text)
            except pa.ArrowInvalid:
                pass  # numbers and text in one column: their lines written with each text's number (read_split), or read alone
        texts = self.mistyped(first, self.text_as_number) is not None
        if texts or _number_for_text(first, self.text_columns) is not None:
            try:
                return self.read_split(lines, epoch, numbers=texts)
            except pa.ArrowInvalid:
                pass  # the events with a number there (or with text in a number column) are read alone
        if self.stray(first) is None:  # text in a required column or a partition's source
            raise first
        ends = list(itertools.accumulate((len(line) + 1 for line in lines), initial=0))  # where each line ends in the lines' bytes
        end = ends[-1]
        budget = REREAD_TIMES * end
        parts, start, alone = [], 0, 0
        alone_nulled: dict[str, set[int]] = {}  # the rows of events read alone whose text was made NULL, by column
        while start < len(lines):
            budget -= end - ends[start]
            if budget < 0:
                raise first
            try:
                parts.append(self.read_lines(lines[start:], epoch))
                break
            except pa.ArrowInvalid as exc:
                found = self.stray(exc)
                if found is None or alone == MAX_MISTYPED or found[1] >= len(lines) - start:
                    raise
                row = start + found[1]
                if row > start:
                    parts.append(self.read_lines(lines[start:row], epoch))
                made_null: set[str] = set()
                parts.append(self.read_alone(lines[row], epoch, made_null))
                for name in made_null:
                    alone_nulled.setdefault(name, set()).add(row)
                alone, start = alone + 1, row + 1
        if len({every_line for _table, every_line in parts}) > 1:
            raise first
        try:
            # The parts' inferred columns (fields the table lacks: only which events hold them
            # counts) may differ in type where one read would have widened them.
            table = pa.concat_tables([table for table, _every_line in parts], promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            raise first from None
        self.nulled_rows.update(alone_nulled)
        return table, parts[0][1]

    def read_split(self, lines: list[bytes], epoch: bool, first: bool = False, numbers: bool = False, together: bool = True) -> tuple[pa.Table, bool]:
        """The events of a body that sends numbers and text in one text column (a user id now
        12345, now "anon"), read in groups, by the text columns where each holds a number
        (Python's json says which): each group by one read of pyarrow, those columns read as
        doubles and spelled as the Spark job spells them (spelled_numbers), the rows put back in
        the events' order. pa.ArrowInvalid past MAX_SPLITS groups, or where the groups' reads do
        not fit together. Only the lines where odd_in_text finds a text column's name before
        a number (or a boolean, an object, a list) are read by Python's json (a tenth of a loose logger's, say): the others go to
        the group that reads every text column as text, whose read by pyarrow refuses any number
        there the search missed (a name spelled with escapes). A line whose numbers there
        quoted_texts can write as their text goes to that group too, so written: most requests
        are one read. So do the lines with a boolean, an object or a list in a text column, and
        those with text in a number column amid numbers (a status now 200, now "200"; now and then
        "n/a"), written with the number each text converts to or null (unquoted), which only so
        written are read (pa.ArrowInvalid where quoted_texts cannot write one): those lines are
        searched for (text_in_number) where `numbers` says the body may hold one, or once a read
        finds one. `first`: tried before any other read (split_last), pa.ArrowInvalid where the
        search finds text in a number column in more than half the lines (a body whose number
        columns come as text throughout is one read of read_numbers). Where a text column holds a
        number in most lines (a status column created as text from a first batch where it was
        now 200, now "200"), the lines that hold nothing else odd and no other value there (a
        second search) are read `together`, the column as integers, each spelled as its digits,
        as the Spark job spells one, without being parsed by Python's json (a tenth of the cost);
        where that read fails (a fraction, a value the search missed) the body is read again
        without."""

        import pyarrow.compute as pc

        whole: list[int] = []  # the lines read together (majority: their text columns read as integers)
        majority: frozenset[str] = frozenset()
        if self.odd_in_text is None or (numbers and self.text_in_number is None):
            candidates: Iterable[int] = range(len(lines))
        else:
            joined = b"\n".join(lines)
            newlines = np.flatnonzero(np.frombuffer(joined, np.uint8) == ord("\n"))

            def lines_of(places: list[tuple[int, bytes, int]]) -> list[int]:
                """The line of each place found in `joined`: how many newlines come before it."""
                return np.searchsorted(newlines, [at for at, _key, _value in places]).tolist() if places else []

            names_at: dict[int, set[bytes]] = {}
            integers: collections.Counter[bytes] = collections.Counter()  # each text column's values that start as a number does
            colons = key_colons(joined)
            odd = self.odd_in_text.found(joined, colons)
            for row, (_at, key, value_start) in zip(lines_of(odd), odd):
                names_at.setdefault(row, set()).add(key)
                if value_start in _NUMBER_STARTS:
                    integers[key] += 1
            found = set(names_at)
            texts: set[int] = set()
            if numbers:
                texts = set(lines_of(self.text_in_number.found(joined, colons)))
                if first and len(texts) * 2 > len(lines):
                    raise pa.ArrowInvalid("most lines hold text in a number column")
                found |= texts
            if together and len(found) * 2 > len(lines):
                majority = frozenset(self.text_names[name] for name, count in integers.items() if count * 2 > len(lines))
            if majority:
                keys = {_json_key(name)[1:-1] for name in majority}
                others = set(lines_of(_other_than_numbers(majority).found(joined, colons))) | texts
                whole = [row for row in range(len(lines)) if row not in others and names_at.get(row, keys) <= keys]
                found.difference_update(whole)
            candidates = sorted(found)
        original, any_unquoted = lines, False
        events: dict[int, dict] = {}
        nulled: dict[str, set[int]] = {}
        groups: dict[tuple[str, ...], list[int]] = {}
        rewritten: dict[int, bytes] = {}
        for row in candidates:
            event = json_event(lines[row])
            copied, texts = self.copied(event), self.unquoted(event)
            if (found := self.numbered(event)) or copied or texts:
                event = exact_numbers(event, lines[row], found)
                if (line := quoted_texts(lines[row], event, found + copied, texts)) is not None:
                    rewritten[row] = line  # read with the rest, those values as their text (and texts as their numbers)
                    for name in (name for name, number in texts.items() if number is None):
                        nulled.setdefault(name, set()).add(row)
                    any_unquoted |= bool(texts)
                    continue
                if copied or texts:
                    raise pa.ArrowInvalid(f"a value in the column {(copied + tuple(texts))[0]!r} this way cannot be sure to read as the Spark job does")
                events[row] = event
                groups.setdefault(found if len(found) < 2 else tuple(sorted(found)), []).append(row)
        if rewritten:
            lines = list(lines)
            for row, line in rewritten.items():
                lines[row] = line
        parts, order = [], []
        if whole:
            try:
                table, every_line = self.read_fields(b"\n".join([lines[row] for row in whole]), epoch, dict.fromkeys(majority, pa.int64()))
            except pa.ArrowInvalid as exc:
                if not numbers and self.mistyped(exc, self.text_as_number) is not None:
                    return self.read_split(original, epoch, first, numbers=True)
                return self.read_split(original, epoch, first, numbers, together=False)
            if table.num_rows != len(whole):
                raise pa.ArrowInvalid(f"{len(whole)} events read as {table.num_rows} rows")
            for name in sorted(majority):  # an integer in a text column is its digits, as the Spark job spells it
                table = table.set_column(table.schema.get_field_index(name), name, table.column(name).cast(self.reading.field(name).type))
            parts.append((table, every_line))
            order += whole
        if len(events) + len(whole) < len(lines):
            rest = np.ones(len(lines), bool)
            rest[list(events)] = False
            rest[whole] = False
            groups[()] = np.flatnonzero(rest).tolist()
        if len(groups) > MAX_SPLITS:
            raise pa.ArrowInvalid(f"numbers in text columns in more than {MAX_SPLITS} ways in one request")
        for as_number, rows in groups.items():
            try:
                table, every_line = self.read_lines([lines[row] for row in rows], epoch, as_number=frozenset(as_number))
            except pa.ArrowInvalid as exc:
                if not numbers and self.mistyped(exc, self.text_as_number) is not None:  # text in a number column: its lines too
                    return self.read_split(original, epoch, first, numbers=True)
                raise
            if table.num_rows != len(rows):
                raise pa.ArrowInvalid(f"{len(rows)} events read as {table.num_rows} rows")
            for name in sorted(as_number):
                table = self.spelled_column(table, name, lambda at, rows=rows: events[rows[at]])
            parts.append((table, every_line))
            order += rows
        if len({every_line for _table, every_line in parts}) > 1:
            raise pa.ArrowInvalid("the groups' fields the table lacks read otherwise")
        try:
            table = pa.concat_tables([table for table, _every_line in parts], promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise pa.ArrowInvalid(f"the groups read otherwise: {str(exc)[:100]}") from None
        self.split_last, self.quoted_last = bool(events or rewritten or whole), any_unquoted
        for name, rows in nulled.items():
            self.nulled_rows.setdefault(name, set()).update(rows)
        return (table if len(parts) == 1 else table.take(pc.sort_indices(pa.array(order)))), parts[0][1]

    def numbered(self, event: dict) -> tuple[str, ...]:
        """The text columns where `event` holds a JSON number, in its order."""
        return tuple([name for name, value in event.items() if type(value) in _NUMBER_TYPES and name in self.text_columns])

    def unquoted(self, event: dict) -> dict[str, int | float | None]:
        """The number columns where `event` holds text, each with what its text converts to as
        numbers_from_text converts it: a plain number's text its number, other text that cannot
        be a number (may_read_as_number) NULL in an optional column. pa.ArrowInvalid for any other
        text (the Spark job's to convert)."""
        found: dict[str, int | float | None] = {}
        for name, text in event.items():
            if type(text) is not str or name not in self.text_as_number:
                continue
            if name in self.integer_columns and _INTEGER_TEXT.match(text):
                found[name] = int(text)
            elif name not in self.integer_columns and _PLAIN_NUMBER_TEXT.match(text) and math.isfinite(number := float(text)):
                found[name] = number
            elif name in self.text_as_null and not may_read_as_number(text):
                found[name] = None
            else:
                raise pa.ArrowInvalid(f"text in the number column {name!r} the Spark job may read otherwise: {text[:40]!r}")
        return found

    def copied(self, event: dict) -> tuple[str, ...]:
        """The text columns where `event` holds a JSON boolean, object or list, in its order."""
        return tuple([name for name, value in event.items() if type(value) in _COPIED_TYPES and name in self.text_columns])

    def spelled_column(self, table: pa.Table, name: str, events: Callable[[int], dict]) -> pa.Table:
        """`table` with its text column `name`, read as doubles, spelled (spelled_numbers)."""
        spelled = spelled_numbers(table.column(name), events, name).cast(self.reading.field(name).type)
        return table.set_column(table.schema.get_field_index(name), name, spelled)

    def numbers_as_text(self, lines: list[bytes], row: int) -> frozenset[str]:
        """The number columns where the event pyarrow stopped at holds a plain number's text."""
        try:
            event = json_event(lines[row])
        except (pa.ArrowInvalid, IndexError):
            return frozenset()
        return frozenset(name for name in self.text_as_number if isinstance(value := event.get(name), str) and _PLAIN_NUMBER_TEXT.match(value))

    def read_alone(self, line: bytes, epoch: bool, made_null: set[str]) -> tuple[pa.Table, bool]:
        """One event with text in a number column or a number in a text column: read with the
        first as text, each value checked to be no number, then NULL in the column's type (its
        column in `made_null`), the second as a double, spelled as the Spark job spells it
        (spelled_numbers). Which columns are such is the line's, read by Python's json: one read
        of the line by pyarrow, however many such columns it has."""
        event = json_event(line)
        as_text = frozenset(name for name in self.text_as_null if isinstance(event.get(name), str))
        as_number = self.numbered(event)
        event = exact_numbers(event, line, as_number)
        table, every_line = self.read_lines([line], epoch, as_text, as_number)
        if table.num_rows != 1:
            raise pa.ArrowInvalid(f"one event self.read as {table.num_rows} rows")
        for name in as_number:
            table = self.spelled_column(table, name, lambda _row: event)
        for name in as_text:
            text = table.column(name)[0].as_py()
            if text is not None and may_read_as_number(text):
                raise pa.ArrowInvalid(f"text in number column {name!r} the Spark job may read as a number")
            if text is not None:
                made_null.add(name)
            table = table.set_column(table.schema.get_field_index(name), name, pa.nulls(1, self.reading.field(name).type))
        return table, every_line

    def parse(self, body: bytes) -> tuple[pa.Table, bool, bool]:
        """read_fields's answer, and whether time columns came as integers (epoch)."""
        failed = None
        for epoch in self.epoch_order:
            try:
                table, every_line = self.read_texts(body, epoch)
            except pa.ArrowInvalid as exc:
                if not self.kinds or "changed from" not in str(exc):  # not a time column sent the other way
                    raise
                failed = exc
                continue
            self.epoch_order = (epoch, not epoch)  # the way that read last goes first
            return table, every_line, epoch
        raise failed

    def rows_of(self, body: bytes) -> tuple[pa.Table, int]:
        """The body's rows and its number of events; Refused saying why this way cannot."""
        return self.processed(*self.read_rows(body))

    def read_rows(self, body: bytes) -> tuple[pa.Table, int]:
        """The body's rows before the processors, and its number of events; Refused saying why
        this way cannot."""
        self.nulled_rows.clear()
        self.dropped_rows = {}
        if is_rows(body):  # an OTLP export's rows as columns (otlp_rows.py)
            rows = from_ipc(body)
            if self.takes_rows:
                try:
                    table = self.in_file_schema(rows)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                    pass  # a column whose type the table changed: its lines are read as any
                else:
                    self.columnar = True
                    return table, rows.num_rows
            body = rows_lines(rows)
        try:
            table, every_line, epoch = self.parse(body)
            if self.renames:
                table = self.renamed_columns(table)
            if self.kinds:
                table = times(table, self.kinds, epoch)
            if self.binary:
                table = binaries(table, self.binary)
            decimals(table, self.decimal)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            if has_set_aside(body):  # (its mark starts no JSON: no read takes such a line)
                raise Refused("events the api set aside for the DLQ (the Spark job writes their dead letters)") from None
            raise Refused(str(exc)[:300]) from None
        if self.drops and (unknown := [name for name in table.column_names if name not in self.known]):
            if any(name not in self.drops and name.casefold() in self.folded_drops for name in unknown):
                raise Refused("a field a drop names in other letter case")
            if not self.extra_fields and (other := next((name for name in unknown if name not in self.drops), None)):
                raise Refused(f"a field the table lacks: {other[:200]!r}")  # read as "infer" for the drops: not left out unsaid
            table = table.drop_columns([name for name in unknown if name in self.drops])
        lines = Lines(body)
        events = len(lines)
        if table.num_rows != events:
            raise Refused(f"{events} events read as {table.num_rows} rows")
        if self.nested_maps and not every_line:
            unknown = next((name for name in table.column_names if name not in self.known), None)
            if unknown is not None and not self.extra_fields and not self.maps and not self.drops:
                raise Refused(f"a field the table lacks: {unknown[:200]!r}")  # read as "infer" for the maps: not left out unsaid
            for name in self.nested_maps:
                if name in table.column_names and pa.types.is_struct(table.column(name).type):
                    column = table.column(name).combine_chunks()
                    made = nested_text_maps(column, self.nested_types[name], column.is_valid().to_numpy(zero_copy_only=False), lines, (name,))
                    table = table.set_column(table.schema.get_field_index(name), name, made)
        if self.nested and (every_line or any(table.column(name).type != self.nested_types[name] for name in self.nested)):
            # A key an object of the table lacks, inferred into its struct (or, reading every
            # line, not looked at): the Spark job names it dropped or keeps it in extra_fields.
            raise Refused("a field inside an object that its column lacks")
        if self.maps:
            if not every_line and self.processors is None and not self.nested and any(
                    pa.types.is_struct(table.column(name).type) and _many_keys(table.column(name).type, table.num_rows)
                    for name in self.maps if name in table.column_names):
                # Objects with many keys (a key per request id, say): pyarrow spends ~40 ms per
                # 1,000 events inferring them. The task's later bodies read them from the lines.
                self.wide_maps = True
            shells = every_line and self.wide_maps
            table = text_maps(table, lines, self.maps, shells, self.known if shells and not self.extra_fields else None)
            if not self.extra_fields and (other := next((name for name in table.column_names if name not in self.known), None)):
                raise Refused(f"a field the table lacks: {other[:200]!r}")
        if self.dropping and every_line:  # a field the table lacks of changing type: not inferred, only its keys looked for
            if (keys := _JsonLayout(body).key_rows(table.num_rows, known=self.known)) is None:
                raise Refused("fields the table lacks, of changing type, whose keys cannot be told apart")
            self.dropped_rows = keys
        elif self.dropping and (unknown := [name for name in table.column_names if name not in self.known]):
            self.dropped_rows = self.dropped_fields(table, unknown, body)
            table = table.drop_columns(unknown)
        if self.extra_fields:
            if self.processors is not None:
                if every_line or any(table.column(name).null_count < table.num_rows for name in table.column_names if name not in self.known):
                    raise Refused("a field the table lacks, and processors: the Spark job spells it by the types it infers")
                extras = pa.nulls(table.num_rows, TEXT_MAP)
            else:
                try:
                    texts = self.object_texts[1] if self.object_texts is not None and self.object_texts[0] is body else None
                    self.object_texts = None
                    if texts is None:  # (read inferring them: which are objects, for the next body)
                        self.object_fields = () if every_line else _object_fields(table, self.known)
                    if not every_line and not self.nested_maps and table.num_columns - len(self.known) > MANY_INFERRED:
                        # (Read again inferring after a few: a producer's bodies are alike, not all of them.)
                        self.wide_memory.gave_up()
                    extras = extra_maps(table, lines, self.known, every_line, body, self.layout_memory, texts)
                except ValueError as exc:  # Unspellable, or a line Python's json reads otherwise
                    raise Refused(f"a field the table lacks: {str(exc)[:200]}") from None
            table = pa.Table.from_arrays([*(table.column(name) for name in self.known), extras], names=[*self.known, self.extra_fields])
        return table, events

    def dropped_fields(self, table: pa.Table, unknown: list[str], body: bytes) -> dict[str, set[int]]:
        """The rows of `table` (read from `body`, the fields the table lacks inferred as the
        columns `unknown`) holding each such field, as the full job names the fields no column
        takes: DROP_KEYS (a table as it is, parsed with its own types: convert.dropped_fields
        lists each event's keys) every key, whatever its value, null too; DROP_VALUES (an
        evolving table: the batch's types inferred) those with a value, where no such field may
        become a column (columns.column_name_ok: a dotted name, say), as the full job would
        evolve the table by any other. Refused where not sure."""
        import pyarrow.compute as pc

        columns = [(name, table.column(name)) for name in unknown]
        if self.dropping == DROP_VALUES:
            if (name := next((name for name in unknown if column_name_ok(name)), None)) is not None:
                raise Refused(f"a field the table lacks: {name[:200]!r}")  # the full job evolves the table by it
            if len(unknown) > MAX_DROPPED_INFERRED:  # (the full job parses a batch of so many with fewer: by their keys)
                raise Refused(f"{len(unknown)} fields the table lacks")
            if any(_holds_empty_object(column.type) for _name, column in columns):
                # Spark's inference leaves out a field that is only ever {} in the batch (no value,
                # not named), but names it where another request gives it keys.
                raise Refused("a field the table lacks holding an empty object")
        elif b"null" in body and any(column.null_count for _name, column in columns):
            # A null is no value to pyarrow, but a key the full job names: where the keys are.
            if (keys := _JsonLayout(body).key_rows(table.num_rows, unknown)) is None:
                raise Refused("fields the table lacks, some null, where their keys cannot be told apart")
            return keys
        return {name: set(pc.indices_nonzero(pc.is_valid(column)).to_pylist()) for name, column in columns if column.null_count < len(column)}

    def processed(self, table: pa.Table, events: int) -> tuple[pa.Table, int]:
        """read_rows's rows through the processors, and how many a where kept."""
        if self.processors is not None:
            if any(negative_zero(column) for column in table.columns):
                raise Refused("a double's -0 with processors: the Spark job reads an integral batch's as a bigint's 0")
            try:
                table = apply_processors(*self.processors, table)
            except (ValueError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise Refused(f"processors: {str(exc)[:200]}") from None
            events = table.num_rows  # the rows a where kept
        return table, events

    def processed_parts(self, table: pa.Table, counts: list[int]) -> list[tuple[pa.Table, int]]:
        """processed's answer for each of the requests whose rows `table` holds one after another
        (`counts` of each), the requests processed as one: the processors work row by row."""
        if self.processors is not None:
            table = table.append_column(PART, pa.array(np.repeat(np.arange(len(counts), dtype=np.int32), counts)))
            table, _events = self.processed(table, table.num_rows)
            counts = np.bincount(table.column(PART).to_numpy(), minlength=len(counts)).tolist()
            table = table.drop_columns([PART])
        offsets = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).tolist()
        return [(table.slice(offset, count), count) for offset, count in zip(offsets, counts)]

    def in_file_schema(self, table: pa.Table) -> pa.Table:
        return pa.Table.from_batches([conform(batch, self.file_schema) for batch in table.to_batches()], schema=self.file_schema)

    def joined(self, tables: list[pa.Table]) -> pa.Table:
        """The requests' rows as one table: in the file's schema when some came as columns (the
        others' as their parse left them, as ever, when none did)."""
        return pa.concat_tables([self.in_file_schema(table) for table in tables] if self.columnar else tables)

    def renamed_columns(self, table: pa.Table) -> pa.Table:
        """The parse's columns by the table's names. A field in any letter case of a new name
        (which the Spark job would rename onto) or of an old name but its own (which Spark's
        rename would take too, or leave alone) refuses the request."""
        for name in table.column_names:
            if name not in self.renames and name.casefold() in self.folded_renames:
                raise Refused(f"a field a rename gives or reads in other letter case, or both names: {name[:200]!r}")
        return table.rename_columns([self.renames.get(name, name) for name in table.column_names])


def _answer(path: str | None = None, counts: dict | None = None, refused: str | None = None, rejected: list[int] | None = None,
            nulled_by_receipt: dict | None = None, dropped_by_receipt: dict | None = None, sink: int = 0) -> pa.RecordBatch:
    """One row of a task's answer: a file written for a sink (its place in the task's sinks); a
    sink's last also its counts and, per request, the columns where values were made NULL and
    the fields no column took (dropped), each with how many events had any; the task's last the
    requests left out."""
    return pa.RecordBatch.from_pylist([{"path": path, "counts": json.dumps(counts or {}), "refused": refused,
                                        "rejected": json.dumps(rejected) if rejected else None,
                                        "nulled": json.dumps(nulled_by_receipt) if nulled_by_receipt else None,
                                        "dropped": json.dumps(dropped_by_receipt) if dropped_by_receipt else None, "sink": sink}],
                                      schema=RESULT_ARROW)


def _reading(sink: tuple) -> tuple:
    """What a task's reading of a body for a sink (BodyReader.read_rows) depends on: the sink's
    arguments less its files' place and size, its processors only by what they rename and drop
    (they are applied after: a sink's routes among them)."""
    _directory, _filesystem, parsing, file_schema, required, extra_fields, partition, changes, processors, _size, text_nulls, dropping = sink
    plan = None if processors is None else (renamed(processors[0]), dropped(processors[0]), nulled(processors[0]))
    return parsing, file_schema, required, extra_fields, partition, changes, text_nulls, dropping, plan


def _fault(data: pa.Table, required: frozenset[str]) -> str | None:
    """What makes rows other than plain rows (the Spark job's DLQ), or None."""
    import pyarrow.compute as pc

    missing = [name for name in required if name in data.column_names and data.column(name).null_count]
    if missing or any(name not in data.column_names for name in required):
        return f"required column {(missing or sorted(required))[0]!r} has no value in an event"
    present = None
    for column in data.columns:
        valid = pc.is_valid(column)
        present = valid if present is None else pc.or_(present, valid)
    if not pc.all(present, min_count=0).as_py():  # (no rows: a where kept none, nothing to say)
        return "an event has no field of the table"
    return None


def reader_fault(exc: Exception) -> str:
    """Why a request whose bytes this reader failed on (a fault of its own, not a Refused: no
    input should reach one) is left to the Spark job, also written to the task's stderr (Spark's
    executor log). A failed task would instead turn the short way off for every tenant's batches
    a while (pipeline_job's DIRECT_OFF_S): one request's odd bytes stay that request's."""
    reason = f"the short way's reader failed on this request ({exc.__class__.__name__}: {str(exc)[:200]})"
    print(f"calve: {reason}", file=sys.stderr)
    return reason


# Small requests are read together: each read of a body costs a task ~0.36 ms whatever it holds
# (pyarrow's reader, the checks and conversions each body gets), ~0.8 ms for 1,000 plain events
# more (measured in one process: 20-event requests cost 16 times as much a event as 1,000-event
# ones read one by one). Consecutive bodies under SMALL_BODY bytes are read as one, up to
# TOGETHER_BYTES in all.
SMALL_BODY = 64 << 10
TOGETHER_BYTES = 256 << 10


def _together(bodies: list[bytes]) -> Iterator[tuple[int, list[bytes]]]:
    """The bodies in runs to read as one (the place of each run's first, its bodies): consecutive
    bodies of NDJSON lines without events the api set aside, up to TOGETHER_BYTES in all; any
    other body, and one of SMALL_BODY bytes or more, is a run of its own."""
    run: list[bytes] = []
    size = first = 0
    for place, body in enumerate(bodies):
        alone = len(body) >= SMALL_BODY or is_rows(body) or has_set_aside(body)
        if run and (alone or size + len(body) > TOGETHER_BYTES):
            yield first, run
            run, size = [], 0
        if alone:
            yield place, [body]
            continue
        if not run:
            first = place
        run.append(body)
        size += len(body) + 1
    if run:
        yield first, run


def _rows_read(readers: list[BodyReader], reads_with: list[int], body: bytes) -> list[tuple[pa.Table, int] | None]:
    """`body` read once by each reader other sinks read alike with (reads_with), before the processors; None for the others."""
    return [readers[index].read_rows(body) if index == mine else None for mine, index in enumerate(reads_with)]


def _read_together(readers: list[BodyReader], reads_with: list[int], bodies: list[bytes]) -> list[list[tuple[tuple[pa.Table, int], dict, dict]]] | None:
    """Each body's reading by each sink (as _append reads a body alone: its rows and how many a
    where kept, the rows a conversion made NULL by column and the rows holding each field no
    column took), the bodies read as one body and
    split again at their lines; None where the bodies together cannot be read so (any refusal or
    fault: each is then read alone, as a request's rows never depend on another's)."""
    joined = b"\n".join(bodies)
    counts = _line_counts(joined, bodies)
    try:
        rows = _rows_read(readers, reads_with, joined)
        if any(read is not None and read[1] != sum(counts) for read in rows):
            return None
        parts = [reader.processed_parts(rows[index][0], counts) for reader, index in zip(readers, reads_with)]
    except Exception:  # noqa: BLE001 - Refused, or a fault of this reader on the bodies' bytes: each read alone says which
        return None
    offsets = np.concatenate([[0], np.cumsum(counts)]).tolist()
    nulled = [_split_rows(readers[index].nulled_rows, offsets) for index in reads_with]
    dropped = [_split_rows(readers[index].dropped_rows, offsets) for index in reads_with]
    return [[(sink_parts[k], sink_nulled[k], sink_dropped[k]) for sink_parts, sink_nulled, sink_dropped in zip(parts, nulled, dropped)]
            for k in range(len(bodies))]


def _line_counts(joined: bytes, bodies: list[bytes]) -> list[int]:
    """How many events each of `bodies` holds (Lines' count), `joined` their text joined by
    newlines: counted in one pass where every line of it starts with a brace (none is blank)."""
    data = np.frombuffer(joined, np.uint8)
    starts = np.flatnonzero(data == ord("\n")) + 1
    starts = np.concatenate([[0], starts[starts < len(data)]])
    if len(data) and (data[starts] == ord("{")).all():
        ends = np.cumsum([len(body) + 1 for body in bodies])  # past each body's separating newline
        return np.diff(np.searchsorted(starts, ends, side="left"), prepend=0).tolist()
    return [len(Lines(body)) for body in bodies]


def _split_rows(by_column: dict[str, set[int]], offsets: list[int]) -> list[dict[str, set[int]]]:
    """Rows by column of bodies read as one, split into each body's (its own row numbers): `offsets`
    its first row's number in the whole and the whole's row count last."""
    split: list[dict[str, set[int]]] = [{} for _ in offsets[1:]]
    for column, rows in by_column.items():
        for row in rows:
            k = bisect.bisect_right(offsets, row) - 1
            split[k].setdefault(column, set()).add(row - offsets[k])
    return split


def _append(sinks: list[tuple], where: tuple[str, bool, str] | None, by_request: bool,
            batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Write a task's requests into each sink's table (sink_arguments each; see append_directly
    and append_routed): per sink one answer row per file written, its last with its counts, the
    task's last also with the requests left out; or one row saying why this way cannot. A
    request is read once for the sinks that read it alike (_reading), then through each sink's
    processors (its routes' condition among them); one left out (by_request) is left out of every
    sink."""
    freeze_once()
    readers = [BodyReader(parsing, file_schema, required, extra_fields, partition, changes, processors, text_nulls, dropping)
               for _d, _f, parsing, file_schema, required, extra_fields, partition, changes, processors, _t, text_nulls, dropping in sinks]
    # Sinks that read a body alike (into tables alike, their routes apart) share one reading of it.
    readings = [_reading(sink) for sink in sinks]
    reads_with = [readings.index(reading) for reading in readings]
    tables: list[list[pa.Table]] = [[] for _ in sinks]  # per sink, its rows of each request taken
    events: list[list[int]] = [[] for _ in sinks]  # ... and how many
    nulled_by_seq: list[dict[int, tuple[list[str], int]]] = [{} for _ in sinks]  # per written request: those columns, and how many of its events
    dropped_by_seq: list[dict[int, tuple[list[str], int]]] = [{} for _ in sinks]  # ... the fields no column took, and how many of its events
    places, rejected = [], []  # the requests taken: (receipt, seq)
    together_memory = FallbackMemory()  # whether the task's last requests read together had one that could not be
    sizes: dict[int, int] = {}  # each written request's body size, by its place
    for batch in batches:
        bodies = batch.column(1).to_pylist()
        if where is not None:  # the column holds entry ids: the task reads their bodies
            try:
                bodies = read_bodies(*where, bodies)
            except Exception as exc:  # noqa: BLE001 - whatever it is, shipping the bodies does without it
                yield _answer(refused=f"{UNREACHABLE}: {str(exc)[:300]}")
                return
        requests = list(zip(batch.column(0).to_pylist(), bodies, batch.column(2).to_pylist()))
        together: dict[int, list] = {}  # each request's reading, by its place, where it was read with its neighbours
        for first, group in _together([body for _receipt, body, _seq in requests]):
            if len(group) > 1 and together_memory.worth_trying():
                if (reads := _read_together(readers, reads_with, group)) is None:
                    together_memory.gave_up()
                else:
                    together.update(enumerate(reads, start=first))
        for place, (receipt, body, seq) in enumerate(requests):
            if (read := together.pop(place, None)) is None:
                try:
                    rows = _rows_read(readers, reads_with, body)
                    read = [(reader.processed(*rows[index]), readers[index].nulled_rows, readers[index].dropped_rows)
                            for reader, index in zip(readers, reads_with)]
                except Exception as exc:  # noqa: BLE001 - Refused, or a fault of this reader on the request's bytes
                    reason = str(exc) if isinstance(exc, Refused) else reader_fault(exc)
                    if not by_request:
                        yield _answer(refused=reason[:300])
                        return
                    rejected.append(seq)  # the Spark job takes this request
                    continue
            for index, ((table, count), nulled_rows, dropped_rows) in enumerate(read):
                tables[index].append(table)
                events[index].append(count)
                if nulled_rows:
                    nulled_by_seq[index][seq] = _named(nulled_rows)
                if dropped_rows:
                    dropped_by_seq[index][seq] = _named(dropped_rows)
            places.append((receipt, seq))
            sizes[seq] = len(body)
    kept = [True] * len(places)
    for index, sink in enumerate(sinks):
        required = sink[4]
        if places and (reason := _fault(readers[reads_with[index]].joined(tables[index]), required)) is not None:
            if not by_request:
                yield _answer(refused=reason)
                return
            # Which requests: looked for only now, so that a batch of plain rows pays one check.
            kept = [keep and _fault(table, required) is None for table, keep in zip(tables[index], kept)]
    if not all(kept):
        rejected += [seq for (_receipt, seq), keep in zip(places, kept) if not keep]
        tables = [[table for table, keep in zip(mine, kept) if keep] for mine in tables]
        events = [[count for count, keep in zip(mine, kept) if keep] for mine in events]
        places = [place for place, keep in zip(places, kept) if keep]
    if not places:
        yield _answer(rejected=rejected)
        return
    for index, sink in enumerate(sinks):
        directory, filesystem, _parsing, file_schema, _required, _extra, partition, changes, _processors, target_file_size, _nulls, _drop = sink
        data = readers[reads_with[index]].joined(tables[index])  # (the reader that read them: whether some came as columns)
        counts: dict[str, int] = {}
        for (receipt, _seq), count in zip(places, events[index]):
            counts[receipt] = counts.get(receipt, 0) + count
        if changes:  # each event inserts (or upserts), at its place: its request's, then its line's
            data = data.append_column(OP, pa.repeat(pa.scalar("I", pa.string()), data.num_rows))
            data = data.append_column(SEQ, pa.chunked_array([pa.array(range(seq, seq + count), pa.int64())
                                                             for (_r, seq), count in zip(places, events[index])]))
            data = data.append_column(RECEIPT, pa.chunked_array([pa.repeat(pa.scalar(receipt, pa.string()), count)
                                                                 for (receipt, _s), count in zip(places, events[index])]))
        per_file = None
        if target_file_size and not changes:  # kept changes are files of the run's, not the table's
            per_file = rows_per_file(target_file_size, sum(events[index]), sum(sizes[seq] for _receipt, seq in places))
        written = write_partitioned(data, directory, filesystem, file_schema, partition, per_file) if data.num_rows else []  # a where kept none
        for path, _rows, _key in written[:-1]:
            yield _answer(path=path, sink=index)
        nulled_by_receipt = {receipt: nulled_by_seq[index][seq] for receipt, seq in places if seq in nulled_by_seq[index]}
        dropped_by_receipt = {receipt: dropped_by_seq[index][seq] for receipt, seq in places if seq in dropped_by_seq[index]}
        yield _answer(path=written[-1][0] if written else None, counts=counts, nulled_by_receipt=nulled_by_receipt,
                      dropped_by_receipt=dropped_by_receipt, sink=index,
                      rejected=rejected if index == len(sinks) - 1 else None)
