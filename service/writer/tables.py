"""The tables a writer's jobs write to: found, created when a sink may, evolved when it asks to,
and described to the Spark job as a Target. Writers create tables and add columns; they never
commit data (see service/iceberg)."""

from __future__ import annotations

import logging
import time

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import BadRequestError
from pyiceberg.table import Table
from pyspark.sql import DataFrame

from service.core import keys
from service.core.metrics import COLUMNS_REFUSED
from service.iceberg.catalog import (
    create_table_once,
    is_reserved_table_name,
    load_table,
    set_identifier_fields,
    set_table_properties,
)
from service.iceberg.files import spark_filesystem
from service.iceberg.schema import evolve_schema
from service.iceberg.upkeep import sink_properties
from service.pipelines.spec import PipelineDefinition, Sink
from service.pipelines.types import EXTRA_FIELDS_TYPE, is_extra_fields_type
from service.tenancy.names import RULE, is_valid_name
from spark_jobs.contract import DLQ_SCHEMA
from spark_jobs.schemas import field_count, inferred_table_schema, needed_widenings, within_limit
from spark_jobs.targets import ChangeSpec, Target, new_directory

log = logging.getLogger(__name__)

EXTRA_FIELDS_ARROW = pa.map_(pa.string(), pa.string())
LIMIT_LOG_S = 600.0


class TableResolver:
    def __init__(self, catalog: Catalog, max_columns: int | None = None) -> None:
        self.catalog = catalog
        self.max_columns = max_columns  # fields at any depth (field_count) a created or evolved table may reach
        self._limit_warned: dict[tuple[str, str], float] = {}  # when each table's limit was last logged
        self._dlq_locations: dict[str, str] = {}
        self._unfit_extra_columns: set[tuple[tuple[str, ...], str]] = set()  # warned about once
        # The tables of the batch being written, loaded once: the short way, its fallback and each
        # sink resolve the same table, and on a REST catalog each load is a round trip.
        self._batch_tables: dict[tuple[str, str], Table | None] = {}

    def new_batch(self) -> None:
        """Forget the tables of the previous batch (another writer may have changed them since)."""
        self._batch_tables.clear()

    def _load(self, tenant: str, name: str) -> Table | None:
        if (tenant, name) not in self._batch_tables:
            self._batch_tables[(tenant, name)] = load_table(self.catalog, tenant, name)
        return self._batch_tables[(tenant, name)]

    def dlq_location(self, tenant: str) -> str:
        """Where the tenant's DLQ table keeps its data (created on first need; it never moves)."""
        if tenant not in self._dlq_locations:
            table = load_table(self.catalog, tenant, keys.DLQ_TABLE) or create_table_once(self.catalog, tenant, keys.DLQ_TABLE, DLQ_SCHEMA)
            self._dlq_locations[tenant] = table.location()
        return self._dlq_locations[tenant]

    def known_schema(self, tenant: str, definition: PipelineDefinition, processors: bool = False) -> pa.Schema | None:
        """The one table's schema when the batch needs nothing else (no processors, routes,
        dynamic names or evolution): events are then parsed with it, skipping type inference.
        processors: the same, but for a definition with processors (the short way may apply them)."""
        if bool(definition.processors) != processors or definition.routes or len(definition.sinks) != 1:
            return None
        sink = definition.sinks[0]
        if sink.dynamic or sink.schema_evolution:
            return None
        table = self._load(tenant, sink.table)
        return table.schema().as_arrow() if table is not None else None

    def evolving_table(self, tenant: str, definition: PipelineDefinition) -> bool:
        """Whether the batch goes to one table that exists and evolves its schema, with no routes,
        dynamic names, extra_fields or row changes: the short way may write its requests that need
        no evolution (pipeline_job.evolving_table), through the plain processors it plans."""
        if definition.routes or len(definition.sinks) != 1:
            return False
        sink = definition.sinks[0]
        if not sink.schema_evolution or sink.dynamic or sink.extra_fields or sink.row_changes:
            return False
        return self._load(tenant, sink.table) is not None

    def routed_tables(self, tenant: str, definition: PipelineDefinition) -> bool:
        """Whether the batch goes through routes or to more than one sink, into tables that all
        exist, none evolving, changing rows or named from the events' fields: the short way may
        write each sink's events (pipeline_job.routed_tables)."""
        if not definition.routes and len(definition.sinks) == 1:
            return False
        if any(sink.dynamic or sink.schema_evolution or sink.row_changes for sink in definition.sinks):
            return False
        return all(self._load(tenant, sink.table) is not None for sink in definition.sinks)

    def resolve(self, tenant: str, name: str, sink: Sink, rows: DataFrame | None) -> Target | str | None:
        """The table `name` as the job needs it, created when the sink may; or why its rows go to
        the DLQ. `rows` None: no rows to create or evolve it from (a table of a declared schema is
        created all the same; None for one to be created from its rows, which the Spark job has)."""
        if not is_valid_name(name) or is_reserved_table_name(self.catalog, name):
            return f"table name {name!r} made from {sink.table!r} is not valid ({RULE})"
        try:
            return self._resolve(tenant, name, sink, rows)
        except BadRequestError as exc:  # a name or schema this catalog refuses: retrying cannot help
            return f"the catalog refused table {name!r}: {exc}"

    def _resolve(self, tenant: str, name: str, sink: Sink, rows: DataFrame | None) -> Target | str | None:
        table = self._load(tenant, name)
        if table is None:
            if not sink.auto_create:
                return f"table {name!r} does not exist and the sink may not create it (auto_create is false)"
            identifiers = sink.identifier_columns or []
            if sink.schema_ is not None:
                schema = sink.schema_.iceberg_schema()
                table = create_table_once(self.catalog, tenant, name, schema, sink.schema_.iceberg_partition_spec(schema))
            else:
                inferred = inferred_table_schema(rows) if rows is not None else None
                if inferred is None:
                    return None
                if not inferred.names:
                    return f"no field of the events has a value to create table {name!r} from"
                absent = [key for key in identifiers if key not in inferred.names]
                if absent:
                    return f"no event has identifier field {absent[0]!r} to create table {name!r} with"
                # Identifier fields must be required: events without them go to the DLQ.
                fields = [field.with_nullable(field.name not in identifiers) for field in inferred if field.name != sink.extra_fields]
                if self.max_columns is not None:
                    budget = self.max_columns - (field_count([pa.field("_", EXTRA_FIELDS_ARROW)]) if sink.extra_fields else 0)
                    ordered = sorted(fields, key=lambda field: field.name not in identifiers)  # identifiers first
                    kept, left_out = within_limit(ordered, budget)
                    self._over_limit(tenant, name, left_out)
                    fields = kept if left_out else fields  # the events' order when all fit
                inferred = pa.schema(fields)
                if sink.extra_fields:
                    inferred = inferred.append(pa.field(sink.extra_fields, EXTRA_FIELDS_ARROW))
                table = create_table_once(self.catalog, tenant, name, inferred)
            if identifiers and not table.schema().identifier_field_ids:
                table = set_identifier_fields(self.catalog, table, identifiers)
            log.info("created table %s.%s", tenant, name)
        if sink.schema_evolution and rows is not None:
            incoming = inferred_table_schema(rows)
            if incoming is None:
                return None
            before = table.schema().schema_id
            table, left_out = evolve_schema(self.catalog, table, needed_widenings(table.schema().as_arrow(), incoming, rows), self.max_columns)
            self._over_limit(tenant, name, left_out)
            if table.schema().schema_id != before:
                log.info("evolved %s.%s to schema %d (%d columns)", tenant, name, table.schema().schema_id, len(table.schema().fields))
        table, extra_fields = self._extra_fields_column(table, sink)
        if sink.switches_to_merge_on_read(table.properties):
            log.warning("table %s.%s switches from copy-on-write to merge-on-read: its sink changes rows and sets no write_mode "
                        "(readers that cannot apply position deletes now see replaced rows; write_mode: copy-on-write keeps it)", tenant, name)
        # Upkeep (planned by the table's leader) reads the sink's settings from the table.
        table = set_table_properties(self.catalog, table, sink_properties(
            sink.target_file_size, sink.snapshot_max_age, sink.snapshot_max_count, sink.resolved_write_mode,
        ))
        self._batch_tables[(tenant, name)] = table
        schema = table.schema()
        changes = None
        if sink.row_changes:
            identifiers = tuple(sink.identifier_columns or [schema.find_column_name(i) for i in schema.identifier_field_ids])
            if not identifiers:
                return f"table {name!r} has no identifier fields: set identifier_columns in the sink to say which columns identify a row"
            absent = [key for key in identifiers if key not in schema.column_names]
            if absent:
                return f"table {name!r} has no column {absent[0]!r} (identifier_columns)"
            changes = ChangeSpec(sink.operation, identifiers, sink.mode == "upsert")
        return Target(
            name=name,
            schema=schema.as_arrow(),
            required=frozenset(f.name for f in schema.fields if f.required),
            partition=[(schema.find_column_name(f.source_id), str(f.transform)) for f in table.spec().fields],
            directory=(directory := new_directory(table.location(), "changes" if changes is not None else "batch")),
            filesystem=spark_filesystem(directory, table.io),
            target_file_size=sink.target_file_size,
            changes=changes,
            extra_fields=extra_fields,
        )

    def _over_limit(self, tenant: str, name: str, left_out: list[str]) -> None:
        """Count the fields a table did not take for its column limit; say so at most every LIMIT_LOG_S."""
        if not left_out:
            return
        COLUMNS_REFUSED.labels(tenant, name).inc(len(left_out))
        now = time.monotonic()
        if now - self._limit_warned.get((tenant, name), -LIMIT_LOG_S) < LIMIT_LOG_S:
            return
        self._limit_warned[(tenant, name)] = now
        shown = ", ".join(left_out[:5]) + (f" and {len(left_out) - 5} more" if len(left_out) > 5 else "")
        log.warning("table %s.%s holds %d fields, its limit (CALVE_MAX_TABLE_COLUMNS): new fields %s are no columns; "
                    "they go to the sink's extra_fields column, or are named as dropped in the answers", tenant, name, self.max_columns, shown)

    def _extra_fields_column(self, table: Table, sink: Sink) -> tuple[Table, str | None]:
        """The table with the sink's extra_fields column (added when it lacks it: a table created
        before, or from a declared schema without it), and the column's name; None when the sink
        has none, or when the table's column of that name is no optional map<string, string>
        (then the fields no column takes are named in the answers instead, as without one)."""
        name = sink.extra_fields
        if name is None:
            return table, None
        try:
            column = table.schema().find_field(name)
        except ValueError:
            # The column where fields beyond the limit go is added even at the limit.
            return evolve_schema(self.catalog, table, pa.schema([pa.field(name, EXTRA_FIELDS_ARROW)]))[0], name
        if is_extra_fields_type(column.field_type) and not column.required:
            return table, name
        if (table.name(), name) not in self._unfit_extra_columns:
            self._unfit_extra_columns.add((table.name(), name))
            log.warning("table %s: column %r is %s, not an optional %s: fields no column takes are dropped (and named in "
                        "each answer); rename extra_fields in the pipeline", ".".join(table.name()), name, column.field_type, EXTRA_FIELDS_TYPE)
        return table, None
