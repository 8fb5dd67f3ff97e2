"""The writer's Spark job for one batch of one pipeline: events in, Parquet per table and DLQ out.

    bodies -> one row per event (receipt, original text)                          events.py
           -> parsed (types inferred from the batch, or the table's own when nothing needs more)
           -> processors (where, set, drop, rename) -> route flags                processors.py
           -> per sink: rows of its routes -> table name (static or from fields)
           -> per table: converted to the table's schema; rows that cannot be     convert.py
              -> DLQ with a reason                                                dlq.py
           -> Parquet: one directory per table (one file per partition value),    partitions.py
              one for the DLQ

A batch that fits its table as it is takes the short way instead (direct_append.py). The catalog
is never touched here: `resolve` (given by the writer) answers what each table looks like,
creating it when the sink may. Expressions were checked when the pipeline was stored.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import reduce
from typing import TypeVar

import pyarrow as pa
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema

from spark_jobs.coerce import shadow_type
from spark_jobs.columns import DROPPED, EVENT, INTERNAL, NULLED, OP, REASON, RECEIPT, SEQ, SIZE, TABLE, any_of
from spark_jobs.contract import SET_ASIDE_MARK
from spark_jobs.convert import convert, holds_maps
from spark_jobs.definition import Definition, Sink
from spark_jobs.direct_append import DROP_KEYS, DROP_VALUES, append_directly, append_routed, has_nested_maps, parse_schema, sink_arguments
from spark_jobs.dlq import DeadLetters
from spark_jobs.events import event_rows, has_set_aside, infer_event_schema, parse, set_aside_rows
from spark_jobs.files import delete_directory, rows_per_file, write_parquet
from spark_jobs.otlp_rows import as_lines
from spark_jobs.partitions import write_data_files
from spark_jobs.plain_processors import is_text_map
from spark_jobs.plain_processors import plan as plan_processors
from spark_jobs.processors import (
    apply_processors,
    apply_routes,
    operation_fields,
    referenced_paths,
    route_column,
    table_name_column,
    untyped_nulls,
    with_fields,
    with_operation,
    with_path,
)
from spark_jobs.schemas import narrowed
from spark_jobs.spark_errors import is_spark_outage
from spark_jobs.stream_bodies import GONE, UNREACHABLE, StreamEntries
from spark_jobs.targets import MAX_DROPPED_NAMES, JobResult, Output, Resolver, Target

log = logging.getLogger(__name__)

MAX_DYNAMIC_TABLES = 100  # per sink and batch; events naming more go to the DLQ
DIRECT_OFF_S = 300  # the short way, once it could not run, is off this long (one try per spell of a lasting cause)
_direct_off_until = 0.0
_pointers_off_until = 0.0  # Spark's tasks read the bodies from Redis again after this (stream_bodies.py)
REFUSED_BEFORE_SKIPPING = 3  # batches of a pipeline the short way refused whole in a row before it skips some
MAX_SKIPPED = 32  # batches skipped at most before the short way is tried again


@dataclass
class ShortWayRefusals:
    """A pipeline's batches that the short way refused whole, in a row, in this process. A shape it
    never takes (an evolving table's every request holding a new field, every request a value of
    another type) would pay for a refused try before each Spark job: after REFUSED_BEFORE_SKIPPING
    such batches the next ones skip it, 1, 2, 4 ... MAX_SKIPPED of them between tries, until a try
    writes something again."""

    streak: int = 0
    skip: int = 0

    def skips(self) -> bool:
        """Whether this batch skips the short way (counted)."""
        if self.skip:
            self.skip -= 1
            return True
        return False

    def record(self, result: JobResult | None, pipeline: str) -> None:
        if result is None or result.direct == "failed":  # not tried (or off for a while of its own)
            return
        if result.direct != "refused":
            self.streak = 0
            return
        self.streak += 1
        if self.streak >= REFUSED_BEFORE_SKIPPING:
            self.skip = min(2 ** (self.streak - REFUSED_BEFORE_SKIPPING), MAX_SKIPPED)
            log.info("pipeline %s: the short way refused %d batches in a row; the next %d go to the Spark job at once",
                     pipeline, self.streak, self.skip)


_refusals: dict[str, ShortWayRefusals] = {}  # by the job's refusals_key


# The column types of an evolving table the short way takes (evolves_alike).
_EVOLVING_TYPES = (pa.types.is_string, pa.types.is_large_string, pa.types.is_int64, pa.types.is_int32, pa.types.is_float64,
                   pa.types.is_boolean)


def evolves_alike(schema: pa.Schema) -> bool:
    """Whether the Spark job, for a batch of an evolving table whose values are all of its columns'
    types, leaves the table as it is and writes what the short way writes: every column text, an
    integer, a double or a boolean, as the differential tests draw them with the batch's types
    inferred. Not a float (widened to a double where a value needs it: the short way reads one
    beyond a float's range as infinite), nor a struct (an int inside one is widened whatever the
    values: inference says long), a list, a map, a decimal or binary (their inferred reading is not
    compared), nor a time or a date: there a request's value depends on the batch's other requests
    (epoch milliseconds 0 beside another request's 1.5 are inferred as a double, and 0.0 is no
    epoch to the conversion: NULL), where the short way reads each request alone."""
    return all(any(check(field.type) for check in _EVOLVING_TYPES) for field in schema)


_DirectAnswer = tuple[dict[str, int] | None, str | None, list[int], dict[str, tuple[list[str], int]], dict[str, tuple[list[str], int]]]  # append_directly's


_Reply = TypeVar("_Reply", bound=tuple)  # an answer of append_directly or append_routed: (..., why not, ...)


def _short_way(append: Callable[[StreamEntries | None], _Reply], entries: StreamEntries | None) -> tuple[_Reply, StreamEntries | None] | None:
    """append(entries) (an append_directly or append_routed call) and the entries it read the bodies from (None:
    shipped): shipped again where Spark's tasks could not reach them. None where it failed
    otherwise than by an outage of Spark (which it raises: the writer waits it out): the short way
    is then off for a while, so that a lasting cause (no pyarrow in Spark's Python, say) costs
    one try per spell."""
    global _direct_off_until, _pointers_off_until  # noqa: PLW0603 - one switch each for the process's jobs
    try:
        answer = append(entries)
        refused = answer[1]
        if answer[0] is None and entries is not None and refused is not None and refused.startswith(UNREACHABLE):
            if GONE in refused:  # taken over: shipped, its hand-off finds it is no longer this writer's
                log.info("%s; this batch's bodies are shipped", refused)
            else:  # Spark's executors cannot reach Redis: ship the bodies a while
                _pointers_off_until = time.monotonic() + DIRECT_OFF_S
                log.warning("%s; the jobs ship the bodies for the next %d s (CALVE_SPARK_READS_REDIS=false: always)", refused, DIRECT_OFF_S)
            entries = None
            answer = append(None)
    except Exception as exc:
        if is_spark_outage(exc):
            raise
        _direct_off_until = time.monotonic() + DIRECT_OFF_S
        log.warning("the short way failed (%s: %s); the Spark job writes batches for the next %d s", exc.__class__.__name__, str(exc)[:300], DIRECT_OFF_S)
        return None
    return answer, entries


def _short_way_ran(append: Callable[[StreamEntries | None], _Reply], entries: StreamEntries | None) -> tuple[_Reply, str] | JobResult:
    """_short_way's answer and where its tasks got the bodies ("redis", or "shipped"), or the
    result saying that it failed or refused the batch (an answer without counts: its reason)."""
    done = _short_way(append, entries)
    if done is None:
        return JobResult(direct="failed")
    answer, entries = done
    way = "shipped" if entries is None else "redis"
    return JobResult(direct="refused", bodies=way) if answer[0] is None else (answer, way)


@dataclass(frozen=True)
class _Where:
    """A where step (spark_jobs/definition.py's Processor): a sink's routes' condition."""

    where: str
    set: None = None
    drop: None = None
    rename: None = None


@dataclass
class PipelineJob:
    spark: SparkSession
    pipeline: str
    version: int
    definition: Definition
    resolve: Resolver
    dlq_directory: str
    dlq_filesystem: object | None = None  # as Target.filesystem, for dlq_directory
    known_schema: pa.Schema | None = None  # parse with this table's types when nothing needs inference
    # The table exists and the definition has processors only (plain_processors.py may plan them for the short way).
    processed_table: bool = False
    # The table exists and its sink evolves its schema (no extra_fields): the short way writes the
    # requests that hold only the table's fields in its types (nothing to evolve; through the
    # processors plain_processors.py plans), and leaves the rest to the Spark job, which infers
    # their types and evolves the table.
    evolving_table: bool = False
    # Every sink's table exists, none evolves, changes rows or takes a name from the events, and the
    # definition has routes or more than one sink: the short way may write each sink's events, its
    # routes' condition a where after the processors (_append_routed).
    routed_tables: bool = False
    json_bytes: dict[str, tuple[int, int]] = field(default_factory=dict)  # table -> (good rows, their JSON bytes)
    dropped: dict[str, dict[str, tuple[list[str], int]]] = field(default_factory=dict)  # table -> receipt -> Output's
    nulled: dict[str, dict[str, tuple[list[str], int]]] = field(default_factory=dict)  # table -> receipt -> Output's
    parsed_with_table_schema: bool = False  # the events' other fields were never parsed: look at their keys
    max_columns: int | None = None  # a batch with more fields is parsed with as many only (schemas.narrowed)
    refusals_key: str | None = None  # whose short way refusals this batch counts in (the tenant's pipeline; None: the pipeline's name)
    task_bytes: int | None = None  # the short way's tasks: one per this many bytes of bodies (direct_append.tasks_for); None: Spark's split

    def __post_init__(self) -> None:
        self.dead_letters = DeadLetters(self.pipeline, self.version, self.dlq_directory, self.dlq_filesystem)

    def run(self, receipts: list[str], bodies: list[bytes], entries: StreamEntries | None = None) -> JobResult:
        """The batch's requests (`bodies`, and `entries`, where Spark's tasks may read them
        themselves: stream_bodies.py) through the pipeline."""
        refusals = _refusals.setdefault(self.refusals_key or self.pipeline, ShortWayRefusals())
        result = None if refusals.skips() else self._append_directly(receipts, bodies, entries)
        refusals.record(result, self.pipeline)
        if result is not None and result.direct == "written":
            return result
        if result is not None and result.direct == "partial":
            return self._rest(result, receipts, bodies)
        tried = result or JobResult()
        result = self._run(receipts, bodies)
        result.direct, result.bodies = tried.direct, tried.bodies
        return result

    def _rest(self, short: JobResult, receipts: list[str], bodies: list[bytes]) -> JobResult:
        """The requests the short way left out (`short.rejected`) through the Spark job, and its
        result with the short way's files and counts added: each request is written by one way,
        as the Spark job would write it alone (a request's events never depend on another's)."""
        try:
            result = self._run([receipts[i] for i in short.rejected], [bodies[i] for i in short.rejected])
        except BaseException:
            for output in short.tables.values():  # never handed off: nothing else will delete them
                delete_directory(output.directory, short.filesystem)
            raise
        for name, output in short.tables.items():
            if name in result.tables:
                result.tables[name].add(output.directory, output.rows_by_receipt, output.nulled_by_receipt, output.dropped_by_receipt)
            else:
                result.tables[name] = output
        result.direct, result.bodies, result.rejected = short.direct, short.bodies, short.rejected
        return result

    def _append_directly(self, receipts: list[str], bodies: list[bytes], entries: StreamEntries | None) -> JobResult | None:
        """The batch written by spark_jobs/direct_append.py when it fits (see there); otherwise
        None, or a result whose `direct` says it was refused, and the Spark job writes it."""
        if time.monotonic() < _direct_off_until or (
                self.known_schema is None and not self.processed_table and not self.evolving_table and not self.routed_tables):
            return None
        aside = [has_set_aside(body) for body in bodies]  # events the api set aside for the DLQ: those requests are the Spark job's
        if all(aside):
            return None
        if self.routed_tables:
            return None if any(aside) else self._append_routed(receipts, bodies, entries)
        sink = self.definition.sinks[0]
        # The table exists (known_schema) and does not evolve, so resolving it reads no rows; were
        # it dropped meanwhile, the empty frame makes the resolver answer "no rows" (the Spark job
        # then creates it from the real ones). An evolving table is taken as it is (no rows: None).
        target = self.resolve(sink.table, sink, None if self.evolving_table else self.spark.range(0))
        if not isinstance(target, Target) or (target.changes is not None and (target.changes.operation is not None or any(aside))):
            return None
        if self.evolving_table and (target.changes is not None or target.extra_fields is not None or not evolves_alike(target.schema)):
            return None
        processors = None
        if self.definition.processors:
            processors = plan_processors(self.definition.processors, target.schema, target.extra_fields, target.required)
            if processors is None or target.changes is not None:
                return None
        if (processors is not None or target.changes is not None or self.evolving_table) and any(has_nested_maps(f.type) for f in target.schema):
            return None  # maps inside objects: the short way reads them only for appends to a table as it is (tests/integration/test_fast_way.py)
        partition = target.partition if target.changes is None else ()  # change files are not partitioned
        parsing = parse_schema(target.schema, target.extra_fields, partition)
        if parsing is None:
            return None
        if time.monotonic() < _pointers_off_until:
            entries = None

        def append(entries: StreamEntries | None) -> _DirectAnswer:
            # Row changes all or nothing: a change's place in the batch orders it (SEQ).
            return append_directly(
                self.spark, receipts, bodies, target.directory, target.filesystem, parsing, target.schema, target.required, target.extra_fields,
                partition, changes=target.changes is not None, entries=entries, by_request=target.changes is None, processors=processors,
                target_file_size=target.target_file_size, task_bytes=self.task_bytes,
                text_nulls=processors is None and target.changes is None and not self.evolving_table,
                dropping=None if target.extra_fields else DROP_VALUES if self.evolving_table else DROP_KEYS,
            )

        done = _short_way_ran(append, entries)
        if isinstance(done, JobResult):
            return done
        (counts, _refused, rejected, nulled, dropped), way = done
        good = {receipt: n for receipt, n in counts.items() if n}
        tables = {target.name: Output(target.directory, good, target.changes, dropped, nulled)} if good else {}
        if len(rejected) == len(bodies):  # none written: the Spark job writes the batch
            return JobResult(direct="refused", bodies=way)
        if rejected:
            return JobResult(tables=tables, direct="partial", bodies=way, rejected=rejected, filesystem=target.filesystem)
        return JobResult(tables=tables, direct="written", bodies=way)

    def _append_routed(self, receipts: list[str], bodies: list[bytes], entries: StreamEntries | None) -> JobResult | None:
        """The batch written by the short way into every sink's table in one job: a sink's events
        are those the processors keep and its routes take (any of them; every event without
        routes), planned as one more `where` after the processors, as the Spark job routes the
        processed events. All or nothing: where a sink's reading refuses a request, no sink's files
        are kept and the Spark job writes the batch, as a request must reach every table one way.
        Not for tables with maps (the Spark job reads them from the types it infers) or rows to change."""
        targets, sinks = [], []
        for sink in self.definition.sinks:
            target = self.resolve(sink.table, sink, self.spark.range(0))
            if not isinstance(target, Target) or target.changes is not None or any(
                    is_text_map(f.type) or has_nested_maps(f.type) for f in target.schema if f.name != target.extra_fields):
                return None
            steps = [*self.definition.processors]
            if sink.routes:
                steps.append(_Where(" OR ".join(f"({self.definition.routes[name]})" for name in sink.routes)))
            processors = plan_processors(steps, target.schema, target.extra_fields, target.required)
            parsing = parse_schema(target.schema, target.extra_fields, target.partition)
            if processors is None or parsing is None:
                return None
            targets.append(target)
            sinks.append(sink_arguments(target.directory, target.filesystem, parsing, target.schema, target.required, target.extra_fields,
                                        target.partition, processors=processors, target_file_size=target.target_file_size))
        if time.monotonic() < _pointers_off_until:
            entries = None
        done = _short_way_ran(lambda entries: append_routed(self.spark, receipts, bodies, sinks, entries, self.task_bytes), entries)
        if isinstance(done, JobResult):
            return done
        (answers, _refused, _rejected, _nulled), way = done
        tables: dict[str, Output] = {}
        for target, (counts, nulled, _dropped) in zip(targets, answers):  # (routed sinks never drop: no dropping)
            good = {receipt: n for receipt, n in counts.items() if n}
            if good:  # (two sinks into one table: one Output)
                tables.setdefault(target.name, Output(target.directory)).add(target.directory, good, nulled)
        return JobResult(tables=tables, direct="written", bodies=way)

    def _run(self, receipts: list[str], bodies: list[bytes]) -> JobResult:
        bodies = [as_lines(body) for body in bodies]  # an OTLP export's columns as their lines (otlp_rows.py)
        events = event_rows(self.spark, receipts, bodies)
        if any(has_set_aside(body) for body in bodies):
            self.dead_letters.add(set_aside_rows(events), F.col(REASON))
            events = events.where(~F.startswith(EVENT, F.lit(SET_ASIDE_MARK)))
        schema = self._known_parse_schema()
        self.parsed_with_table_schema = schema is not None
        parsed = parse(events, schema if schema is not None else self._inferred_schema(events))
        try:
            frame = self._analyzed(parsed)
        except AnalysisException as exc:
            frame = self._analyzed_again(events, parsed, exc)
        try:
            return self._write(frame)
        finally:
            frame.unpersist()

    def _inferred_schema(self, events: DataFrame) -> T.StructType:
        schema = infer_event_schema(self.spark, events)
        fewer = narrowed(schema, self._read_by_definition(), self.max_columns) if self.max_columns else None
        if fewer is not None:
            schema, self.parsed_with_table_schema = fewer, True
        return self._with_table_maps(schema)

    def _with_table_maps(self, schema: T.StructType) -> T.StructType:
        """`schema` with the table's map columns (when the batch has one table: processed_table)
        as maps, as the table's parse reads them, instead of the structs or text inference makes
        of their objects (convert.py would read them again); not those the processors give a value
        or drop."""
        if not self.processed_table:
            return schema
        sink = self.definition.sinks[0]
        target = self.resolve(sink.table, sink, self.spark.range(0))
        if not isinstance(target, Target):
            return schema
        left = self._processed() | self._produced()
        maps = {f.name: shadow_type(f.dataType) for f in from_arrow_schema(target.schema).fields
                if f.name != target.extra_fields and f.name not in left and holds_maps(f.dataType)}
        fields = [T.StructField(f.name, maps.pop(f.name), True) if f.name in maps else f for f in schema.fields]
        return T.StructType(fields + [T.StructField(name, data_type, True) for name, data_type in maps.items()])

    def _analyzed(self, parsed: DataFrame) -> DataFrame:
        """The processed frame, cached: Spark Connect analyzes its plan here, and the sinks'
        operations too (AnalysisException for an expression that does not resolve), before
        anything is written."""
        frame = self._processed_frame(parsed)
        operations = [sink.operation for sink in self.definition.sinks if sink.operation]
        if operations:
            _ = with_fields(frame, operations).select(*[F.expr(operation) for operation in operations]).schema
        return frame.cache()

    def _analyzed_again(self, events: DataFrame, parsed: DataFrame, failure: AnalysisException) -> DataFrame:
        """The batch's frame after its expressions failed Spark's analysis (`failure`) for a cause
        of the batch, not of the definition, tried in turn; `failure` again when none helps:
        - a field they read that no event of the batch has, or JSON null in every event (inferred
          as text), is NULL of no type, then of each type it may be read as (untyped_nulls: NOT
          takes NULL of no type, a CASE WHEN needs a boolean);
        - parsed with the table's types (`_known_parse_schema`), every scalar is text until it is
          converted, and the fields the table lacks are text: an operation that reads one as a
          boolean or a number does not resolve. The batch's types are inferred instead."""
        names = {path[0] for e in self._expressions() for path in referenced_paths(e) if len(path) == 1} - self._processed() - self._produced()

        def attempts() -> Iterator[DataFrame]:
            yield from untyped_nulls(parsed, names)
            if self.known_schema is not None and self.parsed_with_table_schema:
                self.parsed_with_table_schema = False
                inferred = parse(events, self._inferred_schema(events))
                yield inferred
                yield from untyped_nulls(inferred, names)

        for frame in attempts():
            try:
                return self._analyzed(frame)
            except AnalysisException:
                continue
        raise failure

    def _known_parse_schema(self) -> T.StructType | None:
        """The table's schema to parse with, plus the top-level fields an operation expression
        reads (as strings); None when the batch's types must be inferred."""
        if self.known_schema is None:
            return None
        extra = self.definition.sinks[0].extra_fields
        schema = shadow_type(from_arrow_schema(pa.schema([f for f in self.known_schema if f.name != extra])))
        for sink in self.definition.sinks:
            for path in referenced_paths(sink.operation) if sink.operation else ():
                if path[0] in schema.fieldNames():
                    continue
                if len(path) > 1:
                    return None  # a nested field outside the table: infer its type
                schema = schema.add(path[0], T.StringType())
        return schema

    def _processed_frame(self, parsed: DataFrame) -> DataFrame:
        return apply_routes(apply_processors(parsed, self.definition.processors), self.definition.routes)

    def _expressions(self) -> list[str]:
        """The definition's expressions: routes, processors' conditions and values, sinks' operations."""
        expressions = [*self.definition.routes.values()]
        for processor in self.definition.processors:
            expressions += [processor.where] if processor.where is not None else list((processor.set or {}).values())
        return expressions + [sink.operation for sink in self.definition.sinks if sink.operation]

    def _read_by_definition(self) -> set[str]:
        """The top-level fields the definition's expressions, processors and sinks read."""
        names = set(self._processed())
        for sink in self.definition.sinks:
            names.update(name.split(".")[0] for name in sink.table_fields)
            names.update(sink.identifier_columns or ())
        return names | {path[0] for expression in self._expressions() for path in referenced_paths(expression)}

    def _processed(self) -> frozenset[str]:
        """Fields the processors drop or rename: never read again from the events' text."""
        return frozenset(name for p in self.definition.processors for name in [*(p.drop or ()), *(p.rename or {})])

    def _produced(self) -> frozenset[str]:
        """Fields the processors give a value: a set's, a rename's new name."""
        return frozenset(name for p in self.definition.processors for name in [*(p.set or {}), *(p.rename or {}).values()])

    def _write(self, frame: DataFrame) -> JobResult:
        result = JobResult()
        counted: list[DataFrame] = []
        written: list[tuple[str, DataFrame, Target]] = []
        for sink in self.definition.sinks:
            rows = frame
            if sink.routes:
                rows = rows.where(any_of([F.col(route_column(r)) for r in sink.routes]))
            for name in sink.table_fields:
                rows = with_path(rows, tuple(name.split(".")))
            rows = rows.withColumn(TABLE, table_name_column(sink.table, sink.table_fields))
            if sink.dynamic:
                self.dead_letters.add(rows.where(F.col(TABLE).isNull()), F.lit(f"the event lacks a field that the table name {sink.table!r} needs"))
                rows = rows.where(F.col(TABLE).isNotNull())
            for name in self._table_names(rows, sink):
                bound = rows.where(F.col(TABLE) == name)
                target = self.resolve(name, sink, bound.drop(*[c for c in bound.columns if c.startswith(INTERNAL)], *operation_fields(sink)))
                if target is None:  # no rows for it in this batch
                    continue
                if isinstance(target, str):
                    self.dead_letters.add(bound, F.lit(target))
                    continue
                if target.changes is not None:
                    bound = with_operation(bound, target.changes.operation)
                converted = convert(bound, target, operation_fields(sink), self.parsed_with_table_schema, self._processed(), self._produced())
                written.append((name, converted, target))
                counted.append(converted.select(RECEIPT, F.lit(name).alias(TABLE), REASON, F.length(EVENT).alias(SIZE), DROPPED, NULLED))
        counts = self._counts(counted)
        for name, converted, target in written:
            by_receipt = counts.get(name, {})
            good = {receipt: n for receipt, (n, _bad) in by_receipt.items() if n}  # (every sink's into this table)
            if good and target.changes is not None:
                # Row changes are applied later, in commit order, against the table as it is then
                # (spark_jobs/changes_job.py): here they are only kept, in the table's types.
                changes = converted.where(F.col(REASON).isNull()).select(*target.schema.names, OP, SEQ, RECEIPT)
                write_parquet(changes, target.directory, target.filesystem)
            elif good:
                self._write_table(converted.where(F.col(REASON).isNull()), target)
            if good and name in result.tables:  # a second sink into the table: its files beside the first's (its rows counted by table)
                result.tables[name].add(target.directory)
            elif good:
                result.tables[name] = Output(target.directory, good, target.changes, self.dropped.get(name, {}), self.nulled.get(name, {}))
            if any(bad for _n, bad in by_receipt.values()):
                self.dead_letters.add(converted.where(F.col(REASON).isNotNull()), F.col(REASON))
        result.dlq = self.dead_letters.write()
        return result

    def _table_names(self, rows: DataFrame, sink: Sink) -> list[str]:
        if not sink.dynamic:
            return [sink.table]
        names = [r[0] for r in rows.select(TABLE).distinct().limit(MAX_DYNAMIC_TABLES + 1).collect()]
        kept = names[:MAX_DYNAMIC_TABLES]
        if len(names) > MAX_DYNAMIC_TABLES:
            self.dead_letters.add(rows.where(~F.col(TABLE).isin(*kept)), F.lit(f"more than {MAX_DYNAMIC_TABLES} tables from {sink.table!r} in one batch"))
        return kept

    def _counts(self, counted: list[DataFrame]) -> dict[str, dict[str, tuple[int, int]]]:
        """Rows per table and receipt to write and to send to the DLQ: one Spark action for all tables."""
        if not counted:
            return {}
        union = reduce(DataFrame.unionByName, counted)
        bad = F.col(REASON).isNotNull().cast("int")
        good_bytes = F.when(F.col(REASON).isNull(), F.col(SIZE)).otherwise(0)
        # Rows bound for the DLQ keep their whole event there: only written rows lose fields or values.
        dropped = F.when(F.col(REASON).isNull() & (F.size(DROPPED) > 0), F.col(DROPPED))
        nulled = F.when(F.col(REASON).isNull() & (F.size(NULLED) > 0), F.col(NULLED))
        rows = union.groupBy(TABLE, RECEIPT).agg(
            F.count(F.lit(1)).alias("n"), F.sum(bad).alias("bad"), F.sum(good_bytes).alias("bytes"),
            F.slice(F.array_sort(F.array_distinct(F.flatten(F.collect_list(dropped)))), 1, MAX_DROPPED_NAMES).alias("dropped"),
            F.count(dropped).alias("dropping"),
            F.slice(F.array_sort(F.array_distinct(F.flatten(F.collect_list(nulled)))), 1, MAX_DROPPED_NAMES).alias("nulled"),
            F.count(nulled).alias("nulling"),
        ).collect()
        counts: dict[str, dict[str, tuple[int, int]]] = {}
        for table, receipt, total, failed, size, dropped_names, dropping, nulled_names, nulling in rows:
            counts.setdefault(table, {})[receipt] = (total - failed, failed)
            if dropping:
                self.dropped.setdefault(table, {})[receipt] = (list(dropped_names), dropping)
            if nulling:
                self.nulled.setdefault(table, {})[receipt] = (list(nulled_names), nulling)
            seen_rows, seen_bytes = self.json_bytes.get(table, (0, 0))
            self.json_bytes[table] = (seen_rows + total - failed, seen_bytes + (size or 0))
        return counts

    def _write_table(self, good: DataFrame, target: Target) -> None:
        rows, json_bytes = self.json_bytes.get(target.name, (0, 0))
        write_data_files(good, target, rows, rows_per_file(target.target_file_size, rows, json_bytes))
