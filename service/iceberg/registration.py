"""Parquet files written elsewhere, registered into a table (POST /v1/tables/{name}/files): where
they may come from, what they must be, and the DataFile each becomes.

The api checks every file with `registered_data_file` before it accepts it; the table's leader
builds the same DataFile again when it commits (the table may have changed meanwhile), so one
function decides both. A file is refused, with a reason a person can act on, when:
- its location is outside the prefixes the tenant registers from (`allowed_location`): its
  table's own data location (not Calve's own writer directories in it) or the landing prefixes an
  operator granted; odd spellings (`..`, percent-escapes, empty segments) are refused outright,
  and `s3a://`/`s3n://` are compared as `s3://`;
- it is not Parquet, or its footer is larger than the bound;
- its columns do not match the table: by Iceberg field id when the file has ids (and each id's
  name must be the table's), else by name; a column the table lacks, a type the table cannot read
  it as, a required column missing, timestamps in another unit than microseconds;
- a partitioned table: its rows span more than one partition value (read from the values of the
  partition's source columns, never from statistics another writer may have truncated).
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from uuid import UUID

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import (
    _check_pyarrow_schema_compatible,
    compute_statistics_plan,
    data_file_statistics_from_parquet_metadata,
    parquet_path_to_id_mapping,
    pyarrow_to_schema,
)
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.typedef import Record
from pyiceberg.types import DateType, IntegerType, LongType, TimestampType, TimestamptzType

from spark_jobs import contract

PARQUET_MAGIC = b"PAR1"
TAIL_BYTES = 64 * 1024  # read at once from a file's end: most footers fit
# The directories Calve's own writers make in a table's data location (spark_jobs/targets.py,
# writer/diffs.py): never registered from outside, whatever they hold.
_OWN_DIRECTORY = re.compile(rf"^((batch|changes|compact)-[0-9a-f]{{32}}|{re.escape(contract.INTERNAL_PREFIX)}.*)$")
_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://([^/]*)(/.*)?$")
_SCHEME_ALIASES = {"s3a": "s3", "s3n": "s3"}


class FileRefused(ValueError):
    """A file that cannot be registered; `reason` is a short code (metrics label), the message says why."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Location:
    """A file's URI, spelled one way: scheme (aliases folded), bucket or host, path segments."""

    scheme: str
    netloc: str
    parts: tuple[str, ...]

    @property
    def uri(self) -> str:
        return f"{self.scheme}://{self.netloc}/" + "/".join(self.parts)

    def under(self, prefix: Location) -> bool:
        same_store = (self.scheme, self.netloc) == (prefix.scheme, prefix.netloc)
        return same_store and len(self.parts) > len(prefix.parts) and self.parts[: len(prefix.parts)] == prefix.parts


_REFUSED_CHARACTERS = re.compile(r"[\x00-\x1f\x7f\\%]")  # control characters, backslashes, percent-escapes


def parse_location(text: str) -> Location:
    """One spelling of a file URI, or FileRefused: no relative paths, no `.`/`..` or empty
    segments, no percent-escapes (send the decoded name), no backslashes or control characters."""
    if not text or len(text) > 2048:
        raise FileRefused("location", "a file's path must be a URI of 1 to 2048 characters")
    if _REFUSED_CHARACTERS.search(text):
        raise FileRefused(
            "location", f"{text[:200]!r}: percent-escapes, backslashes and control characters are not accepted; send the path as the store names it",
        )
    if text.startswith("/"):
        text = f"file://{text}"
    matched = _SCHEME.match(text)
    if matched is None:
        raise FileRefused("location", f"{text[:200]!r} is not a full URI: send e.g. s3://bucket/prefix/file.parquet")
    scheme, netloc, path = matched.group(1).lower(), matched.group(2), matched.group(3) or "/"
    parts = tuple(path[1:].split("/")) if path != "/" else ()
    if any(part in ("", ".", "..") for part in parts):
        raise FileRefused("location", f"{text[:200]!r}: empty, '.' and '..' path segments are not accepted")
    return Location(_SCHEME_ALIASES.get(scheme, scheme), netloc, parts)


def _prefix(text: str) -> Location:
    return parse_location(text.rstrip("/"))


def allowed_location(path: str, table_location: str, landing: list[str], warehouse: str) -> str:
    """The file's URI in one spelling, when the tenant may register it into this table: under the
    table's data location (not a directory Calve's writers made) or under one of its landing
    prefixes (and then not inside Calve's warehouse, where other tenants' tables live)."""
    location = parse_location(path)
    data = _prefix(f"{table_location.rstrip('/')}/data")
    if location.under(data):
        if _OWN_DIRECTORY.match(location.parts[len(data.parts)]):
            raise FileRefused("location", f"{path[:200]!r} is in a directory Calve's own writers use; land files elsewhere in the table's data location")
        return location.uri
    inside_warehouse = location.under(_prefix(warehouse))
    if not inside_warehouse and any(location.under(_prefix(prefix)) for prefix in landing):
        return location.uri
    where = [data.uri + "/", *(p.rstrip("/") + "/" for p in landing)]
    raise FileRefused("location", f"{path[:200]!r} is not under a prefix this tenant registers from: {', '.join(where)}")


MAX_LANDING_PREFIXES = 100  # granted to one tenant (the api's request model bounds the list)


def granted_landing_prefixes(prefixes: list[str], warehouse: str, others: dict[str, list[str]]) -> list[str]:
    """The landing prefixes an operator grants a tenant, each in one spelling, or FileRefused: a
    full URI (parse_location's rules), not inside Calve's warehouse (where tables live; files there
    are never registered from a landing prefix), and not overlapping, either way, a prefix granted
    to another tenant (`others`: tenant -> its prefixes), whose files would become both tenants'."""
    home = _prefix(warehouse)
    theirs = [(tenant, _prefix(text)) for tenant, texts in sorted(others.items()) for text in texts]
    granted: list[str] = []
    for text in prefixes:
        prefix = _prefix(text)
        if not prefix.parts:
            raise FileRefused("location", f"{text[:200]!r} is a whole bucket or file system: grant a directory in it")
        if prefix == home or prefix.under(home):
            raise FileRefused("location", f"{text[:200]!r} is inside Calve's warehouse ({home.uri}/), where tables live: land files elsewhere")
        for tenant, other in theirs:
            if prefix == other or prefix.under(other) or other.under(prefix):
                raise FileRefused("overlap", f"{text[:200]!r} overlaps {other.uri}/, granted to tenant {tenant!r}: each file must belong to one tenant")
        if prefix.uri + "/" not in granted:
            granted.append(prefix.uri + "/")
    return granted


def read_footer(io: FileIO, path: str, max_footer_bytes: int) -> tuple[pq.FileMetaData, int]:
    """A Parquet file's footer and size, reading at most `max_footer_bytes` of it: one open and,
    for a footer within the file's last TAIL_BYTES, one read (an object store: one HEAD, one GET)."""
    try:
        with io.new_input(path).open() as stream:
            size = stream.seek(0, os.SEEK_END)
            if size < 12:
                raise FileRefused("not_parquet", f"{path} is not a Parquet file ({size} bytes)")
            start = max(0, size - TAIL_BYTES)
            stream.seek(start)
            tail = stream.read(size - start)
            if tail[-4:] != PARQUET_MAGIC:
                raise FileRefused("not_parquet", f"{path} is not a Parquet file (it does not end in the Parquet magic bytes)")
            footer = struct.unpack("<I", tail[-8:-4])[0]
            if footer > max_footer_bytes or footer + 12 > size:
                raise FileRefused("footer", f"{path}: its footer is {footer} bytes; at most {max_footer_bytes} are read (write fewer row groups or columns)")
            if footer + 8 <= len(tail):
                raw = tail[len(tail) - footer - 8:]
            else:
                stream.seek(size - 8 - footer)
                raw = stream.read(footer + 8)
    except FileNotFoundError as exc:
        raise FileRefused("not_found", f"{path}: no such file") from exc
    except OSError as exc:
        raise FileRefused("unreadable", f"{path}: cannot be read ({exc})") from exc
    try:
        return pq.read_metadata(pa.BufferReader(raw)), size
    except (OSError, pa.ArrowException) as exc:
        raise FileRefused("not_parquet", f"{path}: its Parquet footer cannot be read ({exc})") from exc


def _file_schema(metadata: TableMetadata, arrow_schema: pa.Schema) -> Schema:
    """The file's columns with the table's field ids (its own ids, checked against the table's
    names, or the table's names mapped to ids). Files of one writer share a schema: the answer is
    remembered per table schema and file schema (checking costs more than reading a footer)."""
    key = (str(metadata.table_uuid), metadata.current_schema_id, metadata.format_version, arrow_schema.to_string(show_schema_metadata=False))
    known = _checked.get(key)
    if known is None:
        if len(_checked) >= 512:
            _checked.clear()
        try:
            known = _checked[key] = _check_file_schema(metadata, arrow_schema)
        except FileRefused as exc:
            known = _checked[key] = exc
    if isinstance(known, FileRefused):
        raise FileRefused(known.reason, str(known))
    return known


_checked: dict[tuple, Schema | FileRefused] = {}


def _check_file_schema(metadata: TableMetadata, arrow_schema: pa.Schema) -> Schema:
    schema = metadata.schema()
    for field in arrow_schema:
        if pa.types.is_timestamp(field.type) and field.type.unit != "us":
            raise FileRefused("types", (
                f"column {field.name!r} holds timestamps in {field.type.unit}; write microseconds "
                "(Spark: spark.sql.parquet.outputTimestampType=TIMESTAMP_MICROS)"
            ))
    try:
        _check_pyarrow_schema_compatible(schema, arrow_schema, format_version=metadata.format_version)
        file_schema = pyarrow_to_schema(arrow_schema, name_mapping=schema.name_mapping, format_version=metadata.format_version)
    except (ValueError, TypeError) as exc:
        message = str(exc)
        if message.startswith("PyArrow table contains more columns"):
            extra = message.split(": ", 1)[1].split(". Update", 1)[0]
            raise FileRefused("columns", f"the file has columns the table lacks: {extra}; evolve the table's schema first") from exc
        raise FileRefused("types", f"the file's columns do not match the table's: {message}") from exc
    for field in file_schema.fields:
        try:
            known = schema.find_field(field.field_id)
        except ValueError:
            raise FileRefused("columns", f"the file's column {field.name!r} has field id {field.field_id}, which the table lacks") from None
        if known.name != field.name:
            raise FileRefused("columns", f"the file's column {field.name!r} has field id {field.field_id}, which is {known.name!r} in the table")
    return file_schema


# Source types whose Parquet statistics are exact, in the physical form the transforms take
# (integers, days, microseconds): a file's partition value is read from them, not its rows.
_EXACT_STATISTICS = (IntegerType, LongType, DateType, TimestampType, TimestamptzType)


def _partition(metadata: TableMetadata, io: FileIO, path: str, file_schema: Schema, parquet_metadata: pq.FileMetaData) -> Record:
    """The file's one value of each partition field: from its row groups' statistics where they
    are exact, else from the values of the source column."""
    spec, schema = metadata.spec(), metadata.schema()
    values = []
    for field in spec.fields:
        source = schema.find_field(field.source_id)
        name = file_schema.find_column_name(field.source_id)
        if name is None:
            values.append(None)  # the column is absent: every row is null in it
            continue
        transform = field.transform.transform(source.field_type)
        found = _from_statistics(parquet_metadata, name, transform) if isinstance(source.field_type, _EXACT_STATISTICS) else None
        if found is None:
            found = partition_values(io, path, name, transform)
        if len(found) > 1:
            shown = ", ".join(sorted(map(str, found))[:5])
            raise FileRefused("partition", f"{path} holds {len(found)} values of partition {field.name} ({shown}); write one file per partition value")
        values.append(found.pop() if found else None)
    return Record(*values)


def _from_statistics(parquet_metadata: pq.FileMetaData, name: str, transform: Callable) -> set | None:
    """The transformed values of a column's row-group minimums and maximums (None for nulls);
    None when a row group has no usable statistics."""
    found: set = set()
    for group in range(parquet_metadata.num_row_groups):
        row_group = parquet_metadata.row_group(group)
        column = next((row_group.column(i) for i in range(row_group.num_columns) if row_group.column(i).path_in_schema == name), None)
        statistics = column.statistics if column is not None else None
        if statistics is None or not statistics.has_null_count:
            return None
        if statistics.null_count:
            found.add(None)
        if statistics.null_count < row_group.num_rows:
            if not statistics.has_min_max:
                return None
            found.update({transform(statistics.min_raw), transform(statistics.max_raw)})
    return found


def partition_values(io: FileIO, path: str, name: str, transform: Callable) -> set:
    """The transformed values of one column of a Parquet file (None for nulls), read from its rows."""
    with io.new_input(path).open() as stream:
        column = pq.read_table(stream, columns=[name]).column(name)
    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.int64())
    elif pa.types.is_date(column.type):
        column = column.cast(pa.int32())
    return {transform(value) for value in pc.unique(column).to_pylist()}


def registered_data_file(
    metadata: TableMetadata, io: FileIO, path: str, max_footer_bytes: int, expected_size: int | None = None,
) -> DataFile:
    """The DataFile of a Parquet file written elsewhere, after every check (FileRefused if one fails)."""
    parquet_metadata, size = read_footer(io, path, max_footer_bytes)
    if expected_size is not None and expected_size != size:
        raise FileRefused("size", f"{path} is {size} bytes, not the {expected_size} announced: was it overwritten? Register files that never change")
    file_schema = _file_schema(metadata, parquet_metadata.schema.to_arrow_schema())
    schema = metadata.schema()
    statistics = data_file_statistics_from_parquet_metadata(
        parquet_metadata=parquet_metadata,
        stats_columns=compute_statistics_plan(schema, metadata.properties),
        parquet_column_mapping=parquet_path_to_id_mapping(file_schema),
    )
    data_file = DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=_partition(metadata, io, path, file_schema, parquet_metadata),
        file_size_in_bytes=size,
        sort_order_id=None,
        equality_ids=None,
        key_metadata=None,
        **statistics.to_serialized_dict(),
    )
    data_file.spec_id = metadata.default_spec_id  # from_args ignores it
    return data_file


# -- the api's description of a checked file, so that the leader commits it without reading it ---

_STATISTICS = ("column_sizes", "value_counts", "null_value_counts", "nan_value_counts")


def describe(data_file: DataFile, schema_id: int) -> dict | None:
    """A checked file's DataFile as JSON (for the commit entry), valid while the table's schema
    and partition spec are the ones it was checked against; None for a partition value JSON
    cannot carry (the leader then reads the file itself)."""
    try:
        partition = [_encode(data_file.partition[i]) for i in range(len(data_file.partition))]
    except TypeError:
        return None
    return {
        "schema": schema_id, "spec": data_file.spec_id, "bytes": data_file.file_size_in_bytes, "rows": data_file.record_count,
        "partition": partition, "split_offsets": data_file.split_offsets,
        **{name: {str(k): v for k, v in (getattr(data_file, name) or {}).items()} for name in _STATISTICS},
        **{name: {str(k): v.hex() for k, v in (getattr(data_file, name) or {}).items()} for name in ("lower_bounds", "upper_bounds")},
    }


def described_data_file(metadata: TableMetadata, path: str, description: dict) -> DataFile | None:
    """The DataFile the api described, or None when the table's schema or spec changed since."""
    if (description["schema"], description["spec"]) != (metadata.current_schema_id, metadata.default_spec_id):
        return None
    data_file = DataFile.from_args(
        content=DataFileContent.DATA, file_path=path, file_format=FileFormat.PARQUET,
        partition=Record(*(_decode(value) for value in description["partition"])),
        record_count=description["rows"], file_size_in_bytes=description["bytes"], split_offsets=description["split_offsets"],
        sort_order_id=None, equality_ids=None, key_metadata=None,
        **{name: {int(k): v for k, v in description[name].items()} for name in _STATISTICS},
        **{name: {int(k): bytes.fromhex(v) for k, v in description[name].items()} for name in ("lower_bounds", "upper_bounds")},
    )
    data_file.spec_id = description["spec"]
    return data_file


def committed_data_file(metadata: TableMetadata, io: FileIO, path: str, description: dict | None, max_footer_bytes: int) -> DataFile:
    """What the leader commits for a registered file: the api's description when it still holds
    (the file is only asked its size: one that changed or went since is refused), else the file
    checked and read again."""
    described = described_data_file(metadata, path, description) if description else None
    if described is None:
        return registered_data_file(metadata, io, path, max_footer_bytes)
    try:
        size = len(io.new_input(path))
    except FileNotFoundError as exc:
        raise FileRefused("not_found", f"{path}: no such file (removed after it was registered)") from exc
    if size != described.file_size_in_bytes:
        raise FileRefused("size", f"{path} is {size} bytes, not the {described.file_size_in_bytes} registered: it changed after it was registered")
    return described


def _encode(value: object) -> object:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return {"float": value.hex()}
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    if isinstance(value, Decimal):
        return {"decimal": str(value)}
    if isinstance(value, UUID):
        return {"uuid": str(value)}
    raise TypeError(f"no JSON form for a partition value of type {type(value).__name__}")


def _decode(value: object) -> object:
    if not isinstance(value, dict):
        return value
    ((kind, text),) = value.items()
    return {"float": float.fromhex, "bytes": bytes.fromhex, "decimal": Decimal, "uuid": UUID}[kind](text)


def table_columns(metadata: TableMetadata) -> list[dict]:
    """The table's columns as a refused file's answer names them."""
    return [{"name": field.name, "type": str(field.field_type), "required": field.required} for field in metadata.schema().fields]
