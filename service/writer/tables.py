"""The tables a writer's jobs write to: found, created when a sink may, evolved when it asks to,
and described to the Spark job as a Target. Writers create tables and add columns; they never
commit data (see service/iceberg)."""

from __future__ import annotations

import logging

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyspark.sql import DataFrame

from service.core import keys
from service.iceberg.catalog import create_table_once, load_table
from service.iceberg.schema import evolve_schema
from service.pipelines.spec import PipelineDefinition, Sink
from service.tenancy.names import RULE, is_valid_name
from spark_jobs.pipeline_job import (
    DLQ_SCHEMA,
    Target,
    inferred_table_schema,
    needed_widenings,
    new_directory,
)

log = logging.getLogger(__name__)


class TableResolver:
    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self._dlq_locations: dict[str, str] = {}

    def dlq_location(self, tenant: str) -> str:
        """Where the tenant's DLQ table keeps its data (created on first need; it never moves)."""
        if tenant not in self._dlq_locations:
            table = load_table(self.catalog, tenant, keys.DLQ_TABLE) or create_table_once(self.catalog, tenant, keys.DLQ_TABLE, DLQ_SCHEMA)
            self._dlq_locations[tenant] = table.location()
        return self._dlq_locations[tenant]

    def known_schema(self, tenant: str, definition: PipelineDefinition) -> pa.Schema | None:
        """The one table's schema when the batch needs nothing else (no processors, routes,
        dynamic names or evolution): events are then parsed with it, skipping type inference."""
        if definition.processors or definition.routes or len(definition.sinks) != 1:
            return None
        sink = definition.sinks[0]
        if sink.dynamic or sink.schema_evolution:
            return None
        table = load_table(self.catalog, tenant, sink.table)
        return table.schema().as_arrow() if table is not None else None

    def resolve(self, tenant: str, name: str, sink: Sink, rows: DataFrame) -> Target | str | None:
        """The table `name` as the job needs it, created when the sink may; or why its rows go to the DLQ."""
        if not is_valid_name(name) or name.startswith(keys.RESERVED_TABLE_PREFIX):
            return f"table name {name!r} made from {sink.table!r} is not valid ({RULE})"
        table = load_table(self.catalog, tenant, name)
        if table is None:
            if not sink.auto_create:
                return f"table {name!r} does not exist and the sink may not create it (auto_create is false)"
            if sink.schema_ is not None:
                schema = sink.schema_.iceberg_schema()
                table = create_table_once(self.catalog, tenant, name, schema, sink.schema_.iceberg_partition_spec(schema))
            else:
                inferred = inferred_table_schema(rows)
                if inferred is None:
                    return None
                if not inferred.names:
                    return f"no field of the events has a value to create table {name!r} from"
                table = create_table_once(self.catalog, tenant, name, inferred)
            log.info("created table %s.%s", tenant, name)
        if sink.schema_evolution:
            incoming = inferred_table_schema(rows)
            if incoming is None:
                return None
            before = table.schema().schema_id
            table = evolve_schema(self.catalog, table, needed_widenings(table.schema().as_arrow(), incoming, rows))
            if table.schema().schema_id != before:
                log.info("evolved %s.%s: %s", tenant, name, table.schema())
        schema = table.schema()
        return Target(
            name=name,
            schema=schema.as_arrow(),
            required=frozenset(f.name for f in schema.fields if f.required),
            partition=[(schema.find_column_name(f.source_id), str(f.transform)) for f in table.spec().fields],
            directory=new_directory(table.location()),
            target_file_size=sink.target_file_size,
        )
