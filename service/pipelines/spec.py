"""What a pipeline definition may say, checked before it is stored (no I/O here).

A definition is YAML or JSON:

    name: checkout
    source: {http: {path: /checkout}}
    processors:                       # in order, as Spark SQL over the events
      - where: "status IS NOT NULL"
      - set: {amount_eur: "amount / 100.0"}
      - drop: [debug]
      - rename: {svc: service}
    routes:                           # named conditions
      errors: "status >= 500"
    sinks:
      - table: checkout_errors        # static, or dynamic: "${service}_events"
        routes: [errors]              # no routes: every event
        auto_create: true
        schema:
          columns: [{name: ts, type: timestamptz, required: true}, {name: status, type: int}]
          partition_spec: [{column: ts, transform: day}]
        schema_evolution: false
        extra_fields: extra           # a map<string,string> column keeps the fields no column takes
        commit_interval: 5            # seconds
        target_file_size: 134217728   # bytes (compaction's target too)
        snapshot_max_age: 86400       # seconds of snapshots kept (time travel)
        snapshot_max_count: 500
      - table: customers              # row-level changes instead of appends (merge-on-read)
        operation: "op"               # a Spark SQL expression: insert|i|c|r|index|create, update|u, delete|d
        identifier_columns: [id]      # the row's key (required columns): the table's identifier fields
        mode: upsert                  # or append (default): an update of a missing key is then a no-op

Expressions are checked by expressions.py (Spark SQL, an allowlist of functions, bounded size),
column types by types.py (the type grammar). A definition is bounded too: MAX_PROCESSORS,
MAX_ROUTES, MAX_SINKS.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import (
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pyiceberg.types import (
    DoubleType,
    FloatType,
    PrimitiveType,
)

from service.core.exceptions import DefinitionInvalid, SpecError
from service.core.keys import DLQ_TABLE, RESERVED_TABLE_PREFIX
from service.iceberg.rewrites import MERGE_ON_READ, WRITE_MODE_PROPERTIES
from service.pipelines.expressions import MAX_DEFINITION_EXPRESSIONS, Expression, check_expression, is_stored
from service.pipelines.table_schema import Strict, TableSchema, column_name
from service.pipelines.types import EXTRA_FIELDS_TYPE, is_extra_fields_type
from service.tenancy.names import RULE, is_valid_name

DYNAMIC_FIELD = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_.]*)\}")
PATH_PATTERN = re.compile(r"^/[a-z0-9_\-]+(/[a-z0-9_\-]+)*$")
# Calve's own endpoints, and the shippers' protocols (/_bulk and /{index}/_bulk are Elasticsearch's).
RESERVED_PATH_PREFIXES = ("/v1", "/healthz", "/readyz", "/metrics", "/docs", "/openapi", "/redoc", "/otlp", "/loki", "/_bulk")
MAX_PROCESSORS = 100
MAX_ROUTES = 50
MAX_SINKS = 20
MAX_FILE_SIZE = 2**34  # 16 GiB
MAX_IDENTIFIER_COLUMNS = 8
MIN_FILE_SIZE = 2**20  # 1 MiB


# -- the definition -------------------------------------------------------------------------


# A table-sourced pipeline's events carry their change here (insert or delete; an update is the
# insert of its new row): the default operation of its sinks with identifier columns.
FEED_OPERATION = "_change_type"


def is_reserved_path(path: str) -> bool:
    """Whether `path` is one of Calve's own endpoints or a shipper protocol's, at or under a
    reserved segment (`/otlp/v1/logs`, not `/otlp_events`; `/logs/_doc`)."""
    if any(path == prefix or path.startswith(prefix + "/") for prefix in RESERVED_PATH_PREFIXES):
        return True
    # Elasticsearch's document APIs under an index: /{index}/_bulk, /_doc[/{id}], /_create/{id}.
    segments = path.split("/")
    return len(segments) >= 3 and segments[2] in ("_bulk", "_doc", "_create")


class HttpSource(Strict):
    path: str

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        if not PATH_PATTERN.fullmatch(value) or len(value) > 200:
            raise ValueError("a path like /checkout or /team/events: lower-case letters, digits, '_', '-' and '/'")
        if is_reserved_path(value):
            raise ValueError(f"{value} is reserved for Calve's own endpoints")
        return value


class Source(Strict):
    """Where a pipeline's events come from: HTTP requests to a path, or the change feed of one of
    the tenant's tables (each changed row an event, its change as the operation)."""

    http: HttpSource | None = None
    table: str | None = Field(default=None, description="a table of the tenant whose changes flow through this pipeline")
    initial_load: bool = Field(default=True, description="with table: read the table whole first, then its changes")

    @field_validator("table")
    @classmethod
    def _table(cls, value: str | None) -> str | None:
        if value is not None and not is_valid_name(value):
            raise ValueError(f"invalid table name {value!r}: use {RULE}")
        return value

    @model_validator(mode="after")
    def _one(self) -> Source:
        if (self.http is None) == (self.table is None):
            raise ValueError("give exactly one of http (a path) and table (a table's change feed)")
        return self


class Processor(Strict):
    """Exactly one of: where (keep matching rows), set, drop, rename."""

    where: Expression | None = None
    set: dict[str, Expression] | None = None
    drop: list[str] | None = None
    rename: dict[str, str] | None = None

    @model_validator(mode="after")
    def _one(self) -> Processor:
        given = [name for name in ("where", "set", "drop", "rename") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError("each processor is exactly one of where, set, drop, rename")
        if self.where is not None:
            check_expression(self.where)
        for column, expression in (self.set or {}).items():
            column_name(column)
            check_expression(expression)
        for column in self.drop or []:
            column_name(column)
        for old, new in (self.rename or {}).items():
            column_name(old)
            column_name(new)
        return self

    @property
    def kind(self) -> str:
        return next(name for name in ("where", "set", "drop", "rename") if getattr(self, name) is not None)


class Sink(Strict):
    table: str
    routes: list[str] = Field(default_factory=list)
    auto_create: bool = False
    schema_: TableSchema | None = Field(default=None, alias="schema")
    schema_evolution: bool = False
    # The map<string, string> column that keeps each event's top-level fields no other column
    # takes (values as JSON text, strings as they are): nothing is dropped, no column is added.
    extra_fields: str | None = Field(default=None, description="column keeping the fields no other column takes")
    commit_interval: float | None = Field(default=None, gt=0, le=3600, description="seconds between commits")
    target_file_size: int | None = Field(default=None, ge=MIN_FILE_SIZE, le=MAX_FILE_SIZE, description="bytes")
    snapshot_max_age: float | None = Field(default=None, gt=0, le=365 * 86400, description="seconds of history the table keeps")
    snapshot_max_count: int | None = Field(default=None, ge=1, le=100_000, description="snapshots the table keeps at most")
    # Row-level changes: see OPERATIONS.
    operation: Expression | None = Field(default=None, description="Spark SQL expression: each event's operation (insert, update, delete)")
    identifier_columns: list[str] | None = Field(default=None, min_length=1, max_length=MAX_IDENTIFIER_COLUMNS, description="the row's key")
    mode: Literal["append", "upsert"] = Field(default="append", description="upsert: every event replaces the row with its key")
    # How row changes are written: the table's Iceberg write.{delete,update,merge}.mode properties.
    write_mode: Literal["copy-on-write", "merge-on-read"] | None = Field(
        default=None,
        description="merge-on-read (the default): replaced rows as position delete files; copy-on-write: files rewritten",
    )

    @property
    def row_changes(self) -> bool:
        """Events change rows by key instead of being appended."""
        return self.operation is not None or self.mode == "upsert"

    @property
    def resolved_write_mode(self) -> str | None:
        """How the sink's row changes are written: its write_mode, else merge-on-read (None: appends only)."""
        return self.write_mode or ("merge-on-read" if self.row_changes else None)

    def switches_to_merge_on_read(self, properties: dict[str, str]) -> bool:
        """Whether writing this sink's row changes turns a table with `properties` from
        copy-on-write (its write mode property says so, or it has none: Iceberg's default) to
        merge-on-read, for want of a write_mode: readers that cannot apply deletes would notice."""
        return self.write_mode is None and self.row_changes and properties.get(WRITE_MODE_PROPERTIES[0]) != MERGE_ON_READ

    @field_validator("table")
    @classmethod
    def _table(cls, value: str) -> str:
        if DYNAMIC_FIELD.search(value):
            # The fixed parts must be valid on their own, so no event value can smuggle in a dot or slash.
            fixed = DYNAMIC_FIELD.sub("x", value)
            if not is_valid_name(fixed):
                raise ValueError(f"the fixed parts of {value!r} must follow the table name rule: {RULE}")
            return value
        if not is_valid_name(value):
            raise ValueError(f"invalid table name {value!r}: use {RULE}")
        if value.startswith(RESERVED_TABLE_PREFIX):
            raise ValueError(f"table names starting with {RESERVED_TABLE_PREFIX!r} are Calve's own (the DLQ is {DLQ_TABLE})")
        return value

    @field_validator("extra_fields")
    @classmethod
    def _extra_fields(cls, value: str | None) -> str | None:
        return None if value is None else column_name(value)

    @property
    def dynamic(self) -> bool:
        return bool(DYNAMIC_FIELD.search(self.table))

    @property
    def table_fields(self) -> list[str]:
        return DYNAMIC_FIELD.findall(self.table)

    @model_validator(mode="after")
    def _dynamic_has_no_schema(self) -> Sink:
        if self.dynamic and self.schema_ is not None:
            raise ValueError("a dynamic table name cannot have a schema: each resolved table infers its own from its first batch")
        return self


class PipelineDefinition(Strict):
    name: str
    source: Source
    processors: list[Processor] = Field(default_factory=list, max_length=MAX_PROCESSORS)
    routes: dict[str, Expression] = Field(default_factory=dict, max_length=MAX_ROUTES)
    sinks: list[Sink] = Field(min_length=1, max_length=MAX_SINKS)

    @property
    def changes_rows(self) -> bool:
        """Some sink's events change rows by key (see Sink.row_changes)."""
        return any(sink.row_changes for sink in self.sinks)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not is_valid_name(value):
            raise ValueError(f"invalid pipeline name {value!r}: use {RULE}")
        return value

    @field_validator("routes")
    @classmethod
    def _routes(cls, value: dict[str, str]) -> dict[str, str]:
        for name, expression in value.items():
            if not is_valid_name(name):
                raise SpecError(f"routes.{name}", f"invalid route name: use {RULE}")
            try:
                check_expression(expression)
            except ValueError as exc:
                raise SpecError(f"routes.{name}", str(exc)) from None
        return value

    @model_validator(mode="before")
    @classmethod
    def _feed_operation(cls, data: Any) -> Any:
        """A table-sourced pipeline's sinks with identifier columns follow the source's changes,
        deletes included: their operation defaults to FEED_OPERATION (set on the input, so the
        validated model is never changed after the fact)."""
        source = data.get("source") if isinstance(data, dict) else None
        sinks = data.get("sinks") if isinstance(data, dict) else None
        if not isinstance(source, dict) or source.get("table") is None or not isinstance(sinks, list):
            return data
        return {**data, "sinks": [
            {**sink, "operation": FEED_OPERATION}
            if isinstance(sink, dict) and sink.get("operation") is None and sink.get("identifier_columns") is not None else sink
            for sink in sinks
        ]}

    @model_validator(mode="after")
    def _row_changes(self) -> PipelineDefinition:
        for index, sink in enumerate(self.sinks):
            where = f"sinks[{index}]"
            if self.source.table is not None:
                if sink.table == self.source.table:
                    raise SpecError(f"{where}.table", "a pipeline cannot write the table whose changes it reads")
            if sink.operation is not None:
                try:
                    check_expression(sink.operation)
                except ValueError as exc:
                    raise SpecError(f"{where}.operation", str(exc)) from None
            if sink.write_mode is not None and not sink.row_changes:
                raise SpecError(f"{where}.write_mode", "only meaningful with operation or mode: upsert (appends write no deletes)")
            if sink.identifier_columns is None:
                if sink.row_changes and sink.auto_create:
                    raise SpecError(f"{where}.identifier_columns", "required with operation or mode: upsert when the sink may "
                                    "create the table (they become its identifier fields)")
                continue
            if not sink.row_changes:
                raise SpecError(f"{where}.identifier_columns", "only meaningful with operation or mode: upsert")
            names = sink.identifier_columns
            if len(set(names)) != len(names):
                raise SpecError(f"{where}.identifier_columns", f"a column is named twice: {names}")
            for name in names:
                if not is_valid_name(name):
                    raise SpecError(f"{where}.identifier_columns", f"invalid column name {name!r}: use {RULE}")
            if sink.schema_ is not None:
                columns = {column.name: column for column in sink.schema_.columns}
                for name in names:
                    column = columns.get(name)
                    if column is None:
                        raise SpecError(f"{where}.identifier_columns", f"no column {name!r} in the schema")
                    if not column.required:
                        raise SpecError(f"{where}.identifier_columns", f"column {name!r} must be required: true to identify rows")
                    if not isinstance(column.iceberg_type(), PrimitiveType) or isinstance(column.iceberg_type(), (FloatType, DoubleType)):
                        raise SpecError(f"{where}.identifier_columns", f"column {name!r} is {column.type}; an identifier must be a "
                                        "primitive type other than float and double")
        return self

    @model_validator(mode="after")
    def _extra_fields(self) -> PipelineDefinition:
        for index, sink in enumerate(self.sinks):
            name, where = sink.extra_fields, f"sinks[{index}].extra_fields"
            if name is None:
                continue
            if name in (sink.identifier_columns or ()):
                raise SpecError(where, f"column {name!r} identifies rows (identifier_columns); name another column")
            declared = {column.name: column for column in sink.schema_.columns} if sink.schema_ is not None else {}
            column = declared.get(name)
            if column is not None and (column.required or not is_extra_fields_type(column.iceberg_type())):
                raise SpecError(where, f"the schema declares column {name!r} as {column.type}{' (required)' if column.required else ''}: "
                                f"leave it out of the schema or declare it an optional {EXTRA_FIELDS_TYPE}")
        return self

    @model_validator(mode="before")
    @classmethod
    def _expressions_bounded(cls, data: Any) -> Any:
        """All expressions together within MAX_DEFINITION_EXPRESSIONS, counted before any is
        parsed (a refused definition costs nothing to check); definitions read back are not."""
        if is_stored() or not isinstance(data, dict):
            return data

        def texts(value: Any) -> list[str]:
            return [v for v in value.values() if isinstance(v, str)] if isinstance(value, dict) else []

        processors = data.get("processors") if isinstance(data.get("processors"), list) else []
        sinks = data.get("sinks") if isinstance(data.get("sinks"), list) else []
        if len(processors) > MAX_PROCESSORS or len(data.get("routes") or ()) > MAX_ROUTES or len(sinks) > MAX_SINKS:
            return data  # refused for their number, by the fields' own limits
        chars = {"routes": sum(map(len, texts(data.get("routes")))), "processors": 0, "sinks": 0}
        for processor in processors:
            if isinstance(processor, dict):
                found = [processor["where"]] if isinstance(processor.get("where"), str) else texts(processor.get("set"))
                chars["processors"] += sum(map(len, found))
        chars["sinks"] = sum(len(sink["operation"]) for sink in sinks if isinstance(sink, dict) and isinstance(sink.get("operation"), str))
        total = sum(chars.values())
        if total > MAX_DEFINITION_EXPRESSIONS:
            raise SpecError(max(chars, key=chars.get), f"the definition's expressions hold {total} characters in all; at most "
                            f"{MAX_DEFINITION_EXPRESSIONS} are accepted (split the pipeline, or shorten its expressions: "
                            "`x IN (1, 2)` instead of `x = 1 OR x = 2`)")
        return data

    @model_validator(mode="after")
    def _sink_routes_exist(self) -> PipelineDefinition:
        for index, sink in enumerate(self.sinks):
            for route in sink.routes:
                if route not in self.routes:
                    raise SpecError(f"sinks[{index}].routes", f"no route named {route!r} (routes: {sorted(self.routes)})")
        return self


def field_path(loc: tuple[Any, ...]) -> str:
    """('sinks', 0, 'schema', 'columns', 1, 'type') -> 'sinks[0].schema.columns[1].type'."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += ("." if text else "") + str(part)
    return text or "definition"


def parse_definition(data: Any) -> PipelineDefinition:
    """The definition, or SpecErrors (as a list) naming each bad field."""
    if not isinstance(data, dict):
        raise DefinitionInvalid([SpecError("definition", "a mapping (YAML or JSON object) is expected")])
    try:
        return PipelineDefinition.model_validate(data)
    except ValidationError as exc:
        errors = []
        for error in exc.errors():
            loc = tuple(part for part in error["loc"] if not (isinstance(part, str) and "[" in part))
            message = error["msg"].removeprefix("Value error, ")
            if isinstance(error.get("ctx", {}).get("error"), SpecError):
                spec_error = error["ctx"]["error"]
                errors.append(SpecError(spec_error.field, spec_error.message))
                continue
            errors.append(SpecError(field_path(loc), message))
        raise DefinitionInvalid(errors) from None
