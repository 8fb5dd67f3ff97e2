"""The writer's Spark job for one batch of one pipeline: events in, Parquet per table and DLQ out.

    bodies -> one row per event (receipt, original text)
           -> parsed (types inferred from the batch, or the table's own when nothing needs more)
           -> processors (where, set, drop, rename) -> route flags
           -> per sink: rows of its routes -> table name (static or from fields)
           -> per table: converted to the table's schema; rows that cannot be -> DLQ with a reason
           -> Parquet: one directory per table (one file per partition value), one for the DLQ

The catalog is never touched here: `resolve` (given by the writer) answers what each table looks
like, creating it when the sink may. Expressions were checked when the pipeline was stored.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import reduce

import pyarrow as pa
import sqlglot
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from sqlglot import exp

from spark_jobs.buckets import bucket
from spark_jobs.coerce import coerce, declared_not_null, shadow_type
from spark_jobs.direct_append import append_directly, parse_schema
from spark_jobs.files import write_parquet

RECEIPT = "_calve_receipt"
EVENT = "_calve_event"
TABLE = "_calve_table"
REASON = "_calve_reason"
BODY = "_calve_body"
SIZE = "_calve_size"
OP = "_calve_op"  # row changes: I, U or D
SEQ = "_calve_seq"  # row changes: the event's place in the batch (request, then line)
DROPPED = "_calve_dropped"  # the event's top-level fields that no column of its table takes
INTERNAL = "_calve_"
# An event's place: its request's index in the batch times LINE_SLOTS plus its line (a request
# holds at most max_events_per_request events, well below).
LINE_SLOTS = 1 << 24
# Row changes: what an event's operation says, case-insensitively (anything else goes to the DLQ).
OPERATIONS = {
    "insert": "I", "i": "I", "c": "I", "create": "I", "r": "I", "index": "I",
    "update": "U", "u": "U",
    "delete": "D", "d": "D",
}
MAX_DYNAMIC_TABLES = 100  # per sink and batch; events naming more go to the DLQ
MAX_DROPPED_NAMES = 20  # per table and request: the names a receipt lists of the fields dropped
# An event the api set aside for the DLQ: "!" + {"reason": ..., "event": <original text>}
# (= service.ingest.SET_ASIDE_MARK; spark_jobs imports nothing of service).
SET_ASIDE_MARK = "!"

DLQ_ID = "dlq_id"  # = service.core.keys.DLQ_ID (spark_jobs imports nothing of service)
DLQ_SCHEMA = pa.schema([
    pa.field(DLQ_ID, pa.string(), nullable=False),
    pa.field("event", pa.string(), nullable=False),
    pa.field("reason", pa.string(), nullable=False),
    pa.field("pipeline", pa.string(), nullable=False),
    pa.field("pipeline_version", pa.int64(), nullable=False),
    pa.field("table", pa.string()),
    pa.field("receipt", pa.string(), nullable=False),
    pa.field("failed_at", pa.timestamp("us", tz="UTC"), nullable=False),
])


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Target:
    """A table as the job needs it: where to write, its schema, which columns are required."""

    name: str
    schema: pa.Schema  # the Iceberg schema as Arrow
    required: frozenset[str]
    partition: list[tuple[str, str]]  # (source column, transform)
    directory: str
    target_file_size: int | None = None  # bytes; approximate (see rows_per_file)
    changes: ChangeSpec | None = None  # row changes by key instead of appends
    extra_fields: str | None = None  # the map<string, string> column keeping fields no column takes
    filesystem: object | None = None  # a pyarrow FileSystem for `directory` Spark cannot reach itself (spark_jobs/files.py)


@dataclass(frozen=True)
class ChangeSpec:
    """How a sink's events change rows: the operation expression (None: every event inserts), the
    identifier columns, and upsert (an update of a missing key inserts it)."""

    operation: str | None
    keys: tuple[str, ...]
    upsert: bool


@dataclass
class Output:
    """What the job wrote for one table (or the DLQ)."""

    directory: str
    rows_by_receipt: dict[str, int] = field(default_factory=dict)
    changes: ChangeSpec | None = None  # row changes to apply (not data files)
    # receipt -> (up to MAX_DROPPED_NAMES names of fields no column took, events that had any)
    dropped_by_receipt: dict[str, tuple[list[str], int]] = field(default_factory=dict)


@dataclass
class JobResult:
    tables: dict[str, Output] = field(default_factory=dict)
    dlq: Output | None = None
    # spark_jobs/direct_append.py: "written" (it wrote the batch), "refused" (a value needs the
    # Spark job, which wrote it), "failed" (it could not run: the Spark job wrote it), None (the
    # batch could not take it)
    direct: str | None = None


# resolve(table name, the sink's definition, the rows bound for it) -> Target, a reason to send
# those rows to the DLQ, or None when there are none
Resolver = Callable[[str, object, DataFrame], "Target | str | None"]


def event_rows(spark: SparkSession, receipts: list[str], bodies: list[bytes]) -> DataFrame:
    """One row per event: its request's receipt, its original JSON text and its place in the batch."""
    arrow = pa.table({
        RECEIPT: pa.array(receipts, type=pa.string()),
        BODY: pa.array(bodies, type=pa.large_binary()).cast(pa.large_string()),
        SEQ: pa.array([index * LINE_SLOTS for index in range(len(bodies))], type=pa.int64()),
    })
    frame = spark.createDataFrame(arrow)
    lines = frame.select(RECEIPT, SEQ, F.posexplode(F.split(F.col(BODY), "\n")).alias("_calve_line", EVENT))
    return lines.select(RECEIPT, EVENT, (F.col(SEQ) + F.col("_calve_line")).alias(SEQ)).where(F.length(EVENT) > 0)


def has_set_aside(body: bytes) -> bool:
    return body.startswith(SET_ASIDE_MARK.encode()) or b"\n" + SET_ASIDE_MARK.encode() in body


def set_aside_rows(events: DataFrame) -> DataFrame:
    """The events the api set aside: their original text as EVENT, and the api's REASON."""
    wrapped = F.substring(EVENT, 2, 2**31 - 1)
    return events.where(F.startswith(EVENT, F.lit(SET_ASIDE_MARK))).select(
        RECEIPT, F.get_json_object(wrapped, "$.event").alias(EVENT), F.get_json_object(wrapped, "$.reason").alias(REASON)
    )


def infer_event_schema(spark: SparkSession, events: DataFrame) -> T.StructType:
    """The fields of this batch's events as Spark's JSON reader infers them (integers are long,
    other numbers double, ISO timestamps stay strings until a table's schema says otherwise)."""
    inferred = spark.read.json(events.select(EVENT)).schema
    return T.StructType([f for f in inferred.fields if not f.name.startswith(INTERNAL) and f.name != "_corrupt_record"])


def parse(events: DataFrame, schema: T.StructType) -> DataFrame:
    parsed = events.select(RECEIPT, EVENT, SEQ, F.from_json(EVENT, schema).alias("_calve_e"))
    return parsed.select(RECEIPT, EVENT, SEQ, *[F.col("_calve_e").getField(f.name).alias(f.name) for f in schema.fields])


def referenced_paths(expression: str) -> set[tuple[str, ...]]:
    """The fields an expression reads, as paths (`http.status` -> ("http", "status"))."""
    tree = sqlglot.parse_one(expression, read="spark")
    return {tuple(part.name for part in column.parts) for column in tree.find_all(exp.Column) if column.parts}


def with_path(frame: DataFrame, path: tuple[str, ...]) -> DataFrame:
    """The frame with field `path` present (NULL where it was missing), so that an expression over
    a field no event of this batch has reads NULL instead of failing the whole job."""
    root, rest = path[0], path[1:]

    def nulls(names: tuple[str, ...]) -> Column:
        value = F.lit(None).cast("string")
        for name in reversed(names):
            value = F.struct(value.alias(name))
        return value

    if root not in frame.columns:
        return frame.withColumn(root, nulls(rest))
    data_type = frame.schema[root].dataType
    for depth, name in enumerate(rest):
        if not isinstance(data_type, T.StructType):
            return frame  # a map, array or scalar: Spark's own rules apply
        if name not in data_type.fieldNames():
            return frame.withColumn(root, F.col(root).withField(".".join(rest[: depth + 1]), nulls(rest[depth + 1:])))
        data_type = data_type[name].dataType
    return frame


def _with_fields(frame: DataFrame, expressions: list[str]) -> DataFrame:
    for path in sorted(set().union(*(referenced_paths(e) for e in expressions))) if expressions else []:
        frame = with_path(frame, path)
    return frame


def apply_processors(frame: DataFrame, processors: list) -> DataFrame:
    for processor in processors:
        if processor.where is not None:
            frame = _with_fields(frame, [processor.where]).where(F.coalesce(F.expr(processor.where).cast("boolean"), F.lit(False)))
        elif processor.set is not None:
            frame = _with_fields(frame, list(processor.set.values()))
            frame = frame.withColumns({name: F.expr(expression) for name, expression in processor.set.items()})
        elif processor.drop is not None:
            frame = frame.drop(*processor.drop)
        elif processor.rename is not None:
            frame = frame.withColumnsRenamed({old: new for old, new in processor.rename.items() if old in frame.columns})
    return frame


def route_column(name: str) -> str:
    return f"{INTERNAL}route_{name}"


def apply_routes(frame: DataFrame, routes: dict[str, str]) -> DataFrame:
    if not routes:
        return frame
    frame = _with_fields(frame, list(routes.values()))
    return frame.withColumns({route_column(n): F.coalesce(F.expr(e).cast("boolean"), F.lit(False)) for n, e in routes.items()})


def table_name_column(template: str, dynamic_fields: list[str]) -> Column:
    """`${service}_events` -> concat(lower(service), '_events'); NULL when the event lacks a field."""
    if not dynamic_fields:
        return F.lit(template)
    parts: list[Column] = []
    rest = template
    for name in dynamic_fields:
        before, _, rest = rest.partition("${" + name + "}")
        if before:
            parts.append(F.lit(before))
        parts.append(F.lower(F.col(name).cast("string")))  # concat is NULL when a field is missing
    if rest:
        parts.append(F.lit(rest))
    return F.concat(*parts)


PARQUET_PER_JSON_BYTE = 0.25  # zstd Parquet of JSON-shaped events: roughly a quarter of the JSON


def rows_per_file(target_bytes: int | None, rows: int, json_bytes: int) -> int | None:
    """Rows per data file so that a file comes out near `target_bytes`, estimated from the JSON
    size of the batch's rows (the Parquet size is only known once written). None: no target."""
    if not target_bytes or not rows or not json_bytes:
        return None
    row_bytes = max(1.0, json_bytes / rows * PARQUET_PER_JSON_BYTE)
    return max(1, int(target_bytes / row_bytes))


def partition_value(column: Column, transform: str) -> Column:
    """The Iceberg partition value of `transform` (UTC), to group a file's rows by."""
    if transform == "identity":
        return column
    if transform == "year":
        return F.year(column) - 1970
    if transform == "month":
        return (F.year(column) - 1970) * 12 + F.month(column) - 1
    if transform == "day":
        return F.datediff(F.to_date(column), F.lit("1970-01-01").cast("date"))
    if transform == "hour":
        return F.floor(F.unix_micros(column.cast("timestamp")) / 3_600_000_000)
    raise ValueError(f"unsupported transform {transform}")


def _truncate(column: Column, width: int, data_type: T.DataType) -> Column:
    if isinstance(data_type, T.StringType):
        return F.substring(column, 1, width)
    if isinstance(data_type, T.BinaryType):
        return F.substring(column, 1, width)
    # Integers: v - (((v % W) + W) % W), as Iceberg defines it for negatives too.
    return column - (((column % width) + width) % width)


DIRECT_OFF_S = 300
_direct_off_until = 0.0


@dataclass
class PipelineJob:
    spark: SparkSession
    pipeline: str
    version: int
    definition: object  # service.pipeline_spec.PipelineDefinition (kept free of service imports)
    resolve: Resolver
    dlq_directory: str
    dlq_filesystem: object | None = None  # as Target.filesystem, for dlq_directory
    known_schema: pa.Schema | None = None  # parse with this table's types when nothing needs inference
    dlq_frames: list[DataFrame] = field(default_factory=list)
    json_bytes: dict[str, tuple[int, int]] = field(default_factory=dict)  # table -> (good rows, their JSON bytes)
    dropped: dict[str, dict[str, tuple[list[str], int]]] = field(default_factory=dict)  # table -> receipt -> Output's
    parsed_with_table_schema: bool = False  # the events' other fields were never parsed: look at their keys

    def run(self, receipts: list[str], bodies: list[bytes]) -> JobResult:
        result = self._append_directly(receipts, bodies)
        if result is not None and result.direct == "written":
            return result
        direct = result.direct if result is not None else None
        result = self._run(receipts, bodies)
        result.direct = direct
        return result

    def _append_directly(self, receipts: list[str], bodies: list[bytes]) -> JobResult | None:
        """The batch written by spark_jobs/direct_append.py when it fits (see there); otherwise
        None, or a result whose `direct` says it was refused, and the Spark job writes it."""
        global _direct_off_until  # noqa: PLW0603 - one switch for the process's jobs
        if self.known_schema is None or time.monotonic() < _direct_off_until or any(has_set_aside(body) for body in bodies):
            return None
        sink = self.definition.sinks[0]
        if getattr(sink, "row_changes", False) or getattr(sink, "target_file_size", None):
            return None
        # The table exists (known_schema) and does not evolve, so resolving it reads no rows; were
        # it dropped meanwhile, the empty frame makes the resolver answer "no rows" (the Spark job
        # then creates it from the real ones).
        target = self.resolve(sink.table, sink, self.spark.range(0))
        if not isinstance(target, Target) or target.changes is not None or target.partition:
            return None
        parsing = parse_schema(target.schema, target.extra_fields)
        if parsing is None:
            return None
        try:
            counts, _refused = append_directly(
                self.spark, receipts, bodies, target.directory, target.filesystem, parsing, target.schema, target.required,
            )
        except Exception as exc:  # noqa: BLE001 - the Spark job writes the batch: only speed is lost
            # A Spark whose Python workers cannot run it (no pyarrow there, say), or an outage the
            # Spark job then meets too. Off for a while, so that a lasting cause costs one try per spell.
            _direct_off_until = time.monotonic() + DIRECT_OFF_S
            log.warning("the short way failed (%s: %s); the Spark job writes batches for the next %d s",
                        exc.__class__.__name__, str(exc)[:300], DIRECT_OFF_S)
            return JobResult(direct="failed")
        if counts is None:
            return JobResult(direct="refused")
        good = {receipt: n for receipt, n in counts.items() if n}
        return JobResult(tables={target.name: Output(target.directory, good)} if good else {}, direct="written")

    def _run(self, receipts: list[str], bodies: list[bytes]) -> JobResult:
        events = event_rows(self.spark, receipts, bodies)
        if any(has_set_aside(body) for body in bodies):
            self._to_dlq(set_aside_rows(events), F.col(REASON))
            events = events.where(~F.startswith(EVENT, F.lit(SET_ASIDE_MARK)))
        schema = self._known_parse_schema()
        self.parsed_with_table_schema = schema is not None
        if schema is None:
            schema = infer_event_schema(self.spark, events)
        frame = apply_routes(apply_processors(parse(events, schema), self.definition.processors), self.definition.routes)
        frame = frame.cache()
        try:
            return self._write(frame)
        finally:
            frame.unpersist()

    def _known_parse_schema(self) -> T.StructType | None:
        """The table's schema to parse with, plus the top-level fields an operation expression
        reads (as strings); None when the batch's types must be inferred."""
        if self.known_schema is None:
            return None
        extra = self.definition.sinks[0].extra_fields
        schema = shadow_type(from_arrow_schema(pa.schema([f for f in self.known_schema if f.name != extra])))
        for sink in self.definition.sinks:
            for path in referenced_paths(sink.operation) if getattr(sink, "operation", None) else ():
                if path[0] in schema.fieldNames():
                    continue
                if len(path) > 1:
                    return None  # a nested field outside the table: infer its type
                schema = schema.add(path[0], T.StringType())
        return schema

    def _write(self, frame: DataFrame) -> JobResult:
        result = JobResult()
        counted: list[DataFrame] = []
        written: list[tuple[str, DataFrame, Target]] = []
        for sink in self.definition.sinks:
            rows = frame
            if sink.routes:
                rows = rows.where(reduce(lambda a, b: a | b, [F.col(route_column(r)) for r in sink.routes]))
            for name in sink.table_fields:
                rows = with_path(rows, tuple(name.split(".")))
            rows = rows.withColumn(TABLE, table_name_column(sink.table, sink.table_fields))
            if sink.dynamic:
                self._to_dlq(rows.where(F.col(TABLE).isNull()), F.lit(f"the event lacks a field that the table name {sink.table!r} needs"))
                rows = rows.where(F.col(TABLE).isNotNull())
            for name in self._table_names(rows, sink):
                bound = rows.where(F.col(TABLE) == name)
                target = self.resolve(name, sink, bound.drop(*[c for c in bound.columns if c.startswith(INTERNAL)], *operation_fields(sink)))
                if target is None:  # no rows for it in this batch
                    continue
                if isinstance(target, str):
                    self._to_dlq(bound, F.lit(target))
                    continue
                if target.changes is not None:
                    bound = with_operation(bound, target.changes.operation)
                converted = self._convert(bound, target, consumed=operation_fields(sink))
                written.append((name, converted, target))
                counted.append(converted.select(RECEIPT, F.lit(name).alias(TABLE), REASON, F.length(EVENT).alias(SIZE), DROPPED))
        counts = self._counts(counted)
        for name, converted, target in written:
            by_receipt = counts.get(name, {})
            good = {receipt: n for receipt, (n, _bad) in by_receipt.items() if n}
            if good and target.changes is not None:
                # Row changes are applied later, in commit order, against the table as it is then
                # (spark_jobs/changes_job.py): here they are only kept, in the table's types.
                changes = converted.where(F.col(REASON).isNull()).select(*target.schema.names, OP, SEQ, RECEIPT)
                write_parquet(changes, target.directory, target.filesystem)
                result.tables[name] = Output(target.directory, good, target.changes, self.dropped.get(name, {}))
            elif good:
                self._write_table(converted.where(F.col(REASON).isNull()), target)
                result.tables[name] = Output(target.directory, good, dropped_by_receipt=self.dropped.get(name, {}))
            if any(bad for _n, bad in by_receipt.values()):
                self._to_dlq(converted.where(F.col(REASON).isNotNull()), F.col(REASON))
        result.dlq = self._write_dlq()
        return result

    def _table_names(self, rows: DataFrame, sink) -> list[str]:  # noqa: ANN001
        if not sink.dynamic:
            return [sink.table]
        names = [r[0] for r in rows.select(TABLE).distinct().limit(MAX_DYNAMIC_TABLES + 1).collect()]
        kept = names[:MAX_DYNAMIC_TABLES]
        if len(names) > MAX_DYNAMIC_TABLES:
            self._to_dlq(rows.where(~F.col(TABLE).isin(*kept)), F.lit(f"more than {MAX_DYNAMIC_TABLES} tables from {sink.table!r} in one batch"))
        return kept

    def _dropped(self, rows: DataFrame, target: Target, consumed: list[str]) -> Column:
        """The names of the event's top-level fields that no column of the table takes (and no
        operation reads): what writing the row loses, said in the receipt instead of silently."""
        taken = [*target.schema.names, *consumed]
        if self.parsed_with_table_schema:
            # Parsed with the table's own fields, the others were never read: look at the keys.
            return F.array_except(F.coalesce(F.json_object_keys(EVENT), F.array().cast("array<string>")), F.array(*[F.lit(n) for n in taken]).cast("array<string>"))
        extra = [c for c in rows.columns if not c.startswith(INTERNAL) and c not in taken]
        if not extra:
            return F.array().cast("array<string>")
        return F.filter(F.array(*[F.when(F.col(c).isNotNull(), F.lit(c)) for c in extra]), lambda name: name.isNotNull())

    def _extra_fields(self, rows: DataFrame, target: Target, consumed: list[str]) -> Column:
        """The event's top-level fields that no other column of the table takes (and no operation
        reads), non-null ones, as a map of their JSON text (strings as they are); NULL when none."""
        taken = {*[n for n in target.schema.names if n != target.extra_fields], *consumed}
        if self.parsed_with_table_schema:
            # Parsed with the table's own fields, the others were never read: parse them as text,
            # only for the events that have any (listing the keys costs less than the map).
            names = F.array(*[F.lit(n) for n in taken]).cast("array<string>")
            others = F.array_except(F.coalesce(F.json_object_keys(EVENT), F.array().cast("array<string>")), names)
            fields = F.from_json(F.col(EVENT), T.MapType(T.StringType(), T.StringType()))
            kept = F.when(F.size(others) > 0, F.map_filter(fields, lambda k, v: v.isNotNull() & ~F.array_contains(names, k)))
        else:
            types = {f.name: f.dataType for f in rows.schema.fields if not f.name.startswith(INTERNAL) and f.name not in taken}
            if not types:
                return F.lit(None).cast("map<string,string>")
            entries = F.array(*[F.struct(F.lit(name).alias("key"), _as_text(F.col(name), data_type).alias("value")) for name, data_type in types.items()])
            kept = F.map_from_entries(F.filter(entries, lambda entry: entry["value"].isNotNull()))
        return F.when(F.size(kept) > 0, kept)

    def _convert(self, rows: DataFrame, target: Target, consumed: list[str] = ()) -> DataFrame:
        """Rows in the table's types, with a REASON for those that must go to the DLQ instead, and
        the fields no column takes (DROPPED)."""
        source_types = {f.name: f.dataType for f in rows.schema.fields}
        target_fields = from_arrow_schema(target.schema).fields
        keys = set(target.changes.keys) if target.changes is not None else set()
        # A delete needs only the row's key: the table's other required fields may be absent.
        not_delete = F.col(OP) != F.lit("D") if keys else F.lit(True)
        columns, reasons, present = [], [], []
        for column in target_fields:
            if column.name == target.extra_fields:
                kept = self._extra_fields(rows, target, list(consumed))
                columns.append(kept.alias(column.name))
                present.append(kept.isNotNull())
                continue
            if column.name in source_types:
                converted = coerce(F.col(column.name), source_types[column.name], column.dataType)
                present.append(F.col(column.name).isNotNull())
            else:
                converted = coerce(F.lit(None), T.NullType(), column.dataType)
            columns.append(converted.value.alias(column.name))
            missing = F.col(column.name).isNull() if column.name in source_types else F.lit(True)
            if column.name in keys:
                reasons.append(F.when(missing, F.lit(f"missing identifier field {column.name!r}")))
                reasons.append(F.when(~converted.ok, F.lit(f"field {column.name!r} cannot be converted to {column.dataType.simpleString()}")))
            elif column.name in target.required:
                reasons.append(F.when(not_delete & missing, F.lit(f"missing required field {column.name!r}")))
                reasons.append(F.when(not_delete & ~converted.ok,
                                      F.lit(f"field {column.name!r} cannot be converted to {column.dataType.simpleString()}")))
        matches_nothing = ~reduce(lambda a, b: a | b, present) if present else F.lit(True)
        reasons.insert(0, F.when(matches_nothing, F.lit(f"no field of the event matches a column of table {target.name!r}")))
        extra = [SEQ]
        if keys:
            reasons.insert(0, F.when(F.col(OP).isNull(), F.concat(
                F.lit("operation "), F.coalesce(F.concat(F.lit("'"), F.col(OP_VALUE), F.lit("'")), F.lit("null")),
                F.lit(" is not insert, update or delete"),
            )))
            extra.append(OP)
        dropped = F.array().cast("array<string>") if target.extra_fields else self._dropped(rows, target, list(consumed))
        return rows.select(RECEIPT, EVENT, TABLE, *extra, *columns, F.coalesce(*reasons).alias(REASON), dropped.alias(DROPPED))

    def _counts(self, counted: list[DataFrame]) -> dict[str, dict[str, tuple[int, int]]]:
        """Rows per table and receipt to write and to send to the DLQ: one Spark action for all tables."""
        if not counted:
            return {}
        union = reduce(DataFrame.unionByName, counted)
        bad = F.col(REASON).isNotNull().cast("int")
        good_bytes = F.when(F.col(REASON).isNull(), F.col(SIZE)).otherwise(0)
        # Rows bound for the DLQ keep their whole event there: only written rows lose fields.
        dropped = F.when(F.col(REASON).isNull() & (F.size(DROPPED) > 0), F.col(DROPPED))
        rows = union.groupBy(TABLE, RECEIPT).agg(
            F.count(F.lit(1)).alias("n"), F.sum(bad).alias("bad"), F.sum(good_bytes).alias("bytes"),
            F.slice(F.array_sort(F.array_distinct(F.flatten(F.collect_list(dropped)))), 1, MAX_DROPPED_NAMES).alias("dropped"),
            F.count(dropped).alias("dropping"),
        ).collect()
        counts: dict[str, dict[str, tuple[int, int]]] = {}
        for table, receipt, total, failed, size, dropped_names, dropping in rows:
            counts.setdefault(table, {})[receipt] = (total - failed, failed)
            if dropping:
                self.dropped.setdefault(table, {})[receipt] = (list(dropped_names), dropping)
            seen_rows, seen_bytes = self.json_bytes.get(table, (0, 0))
            self.json_bytes[table] = (seen_rows + total - failed, seen_bytes + (size or 0))
        return counts

    def _write_table(self, good: DataFrame, target: Target) -> None:
        rows, json_bytes = self.json_bytes.get(target.name, (0, 0))
        write_data_files(good, target, rows, rows_per_file(target.target_file_size, rows, json_bytes))

    def _to_dlq(self, rows: DataFrame, reason: Column) -> None:
        table = F.col(TABLE) if TABLE in rows.columns else F.lit(None).cast("string")
        self.dlq_frames.append(rows.select(
            F.expr("uuid()").alias("dlq_id"),
            F.col(EVENT).alias("event"),
            reason.alias("reason"),
            F.lit(self.pipeline).alias("pipeline"),
            F.lit(self.version).cast("bigint").alias("pipeline_version"),
            table.alias("table"),
            F.col(RECEIPT).alias("receipt"),
            F.current_timestamp().alias("failed_at"),
        ))

    def _write_dlq(self) -> Output | None:
        if not self.dlq_frames:
            return None
        dead = reduce(DataFrame.unionByName, self.dlq_frames).cache()
        try:
            counts = {receipt: count for receipt, count in dead.groupBy("receipt").count().collect()}
            if not counts:
                return None
            spark_types = {f.name: f.dataType for f in from_arrow_schema(DLQ_SCHEMA).fields}
            required = [
                declared_not_null(F.col(f.name), spark_types[f.name]).alias(f.name) if not f.nullable else F.col(f.name)
                for f in DLQ_SCHEMA
            ]
            write_parquet(dead.select(*required), self.dlq_directory, self.dlq_filesystem, schema=DLQ_SCHEMA)
            return Output(self.dlq_directory, counts)
        finally:
            dead.unpersist()


def _as_text(column: Column, data_type: T.DataType) -> Column:
    """A field's value as an extra_fields map keeps it: strings as they are, others as JSON."""
    if isinstance(data_type, T.StringType):
        return column
    if isinstance(data_type, (T.StructType, T.ArrayType, T.MapType)):
        return F.to_json(column)
    return column.cast("string")


def without_null_types(schema: T.StructType) -> T.StructType:
    """Drop fields whose type is unknown (JSON null everywhere in the batch), at any depth."""
    def keep(data_type: T.DataType) -> T.DataType | None:
        if isinstance(data_type, T.NullType):
            return None
        if isinstance(data_type, T.StructType):
            fields = [T.StructField(f.name, t, True) for f in data_type.fields if (t := keep(f.dataType)) is not None]
            return T.StructType(fields) if fields else None
        if isinstance(data_type, T.ArrayType):
            element = keep(data_type.elementType)
            return T.ArrayType(element, True) if element is not None else None
        return data_type

    return T.StructType([T.StructField(f.name, t, True) for f in schema.fields if (t := keep(f.dataType)) is not None])


def inferred_table_schema(rows: DataFrame) -> pa.Schema | None:
    """A new table's schema from the rows bound for it: the fields that have a value in at least
    one of them (None when there are no rows). One Spark action."""
    columns = [c for c in rows.columns if not c.startswith(INTERNAL)]
    counts = rows.select(F.count(F.lit(1)).alias("_calve_rows"), *[F.count(F.col(c)).alias(c) for c in columns]).first()
    if not counts or not counts["_calve_rows"]:
        return None
    present = [f for f in rows.schema.fields if f.name in columns and counts[f.name]]
    schema = without_null_types(T.StructType(present))
    return to_arrow_schema(schema) if schema.fields else pa.schema([])


def write_data_files(good: DataFrame, target: Target, rows: int = 0, per_file: int | None = None) -> None:
    """The table's data files of `good` (in the table's types) under target.directory: one file
    per partition value for a partitioned table, `per_file` rows per file at most when given."""
    data = good.select(*[
        declared_not_null(F.col(f.name), from_arrow_schema(pa.schema([f]))[0].dataType).alias(f.name)
        if f.name in target.required else F.col(f.name)
        for f in target.schema
    ])
    if per_file and not target.partition:
        data = data.repartition(max(1, -(-rows // per_file)))
    if not target.partition:
        write_parquet(data, target.directory, target.filesystem, schema=target.schema, max_records=per_file)
        return
    types = {f.name: f.dataType for f in from_arrow_schema(target.schema).fields}
    keys = []
    for index, (source, transform) in enumerate(target.partition):
        name = f"{INTERNAL}p{index}"
        if transform.startswith("truncate["):
            value = _truncate(F.col(source), int(transform[len("truncate["):-1]), types[source])
        elif transform.startswith("bucket["):
            value = bucket(F.col(source), types[source], int(transform[len("bucket["):-1]))
        else:
            value = partition_value(F.col(source), transform)
        data = data.withColumn(name, value)
        keys.append(name)
    # One task per partition value, so each value is one file; the source column stays in it.
    write_parquet(data.repartition(*keys), target.directory, target.filesystem, schema=target.schema, max_records=per_file, partition_by=keys)


OP_VALUE = "_calve_op_value"


def operation_fields(sink) -> list[str]:  # noqa: ANN001 - a pipeline Sink
    """The top-level fields a sink's operation reads, other than its identifier columns: they say
    what to do with a row, and are no columns of the table unless its schema declares them."""
    operation = getattr(sink, "operation", None)
    keys = set(getattr(sink, "identifier_columns", None) or ())
    return sorted({path[0] for path in referenced_paths(operation)} - keys) if operation else []


def with_operation(rows: DataFrame, operation: str | None) -> DataFrame:
    """The rows with OP (I, U or D; NULL for a value that names no operation) and OP_VALUE (the
    expression's own value, for the DLQ reason). No operation expression: every event inserts."""
    if operation is None:
        return rows.withColumns({OP: F.lit("I"), OP_VALUE: F.lit("insert")})
    rows = _with_fields(rows, [operation])
    value = F.expr(operation).cast("string")
    mapping = F.create_map(*[F.lit(part) for pair in OPERATIONS.items() for part in pair])
    return rows.withColumn(OP_VALUE, value).withColumn(OP, mapping[F.lower(F.trim(F.col(OP_VALUE)))])


def new_directory(location: str, kind: str = "batch") -> str:
    return f"{location.rstrip('/')}/data/{kind}-{uuid.uuid4().hex}"


NARROW_LIMITS = {pa.int32(): 2**31 - 1, pa.float32(): 3.4e38}


def needed_widenings(current: pa.Schema, incoming: pa.Schema, rows: DataFrame) -> pa.Schema:
    """`incoming` with int/float kept narrow where the table has them and the values still fit.

    JSON says only "number", so inference reports long and double for every number; a table's int
    column is widened to long only when a value needs it (one Spark action, and only when such a
    column is there).
    """
    narrow = {f.name: f.type for f in current if f.type in NARROW_LIMITS}
    candidates = [f.name for f in incoming if f.name in narrow and f.type != narrow[f.name]]
    if not candidates:
        return incoming
    peaks = rows.select(*[F.max(F.abs(F.col(name))).alias(name) for name in candidates]).first()
    kept = []
    for column in incoming:
        if column.name in candidates and (peaks[column.name] is None or peaks[column.name] <= NARROW_LIMITS[narrow[column.name]]):
            column = column.with_type(narrow[column.name])
        kept.append(column)
    return pa.schema(kept)
