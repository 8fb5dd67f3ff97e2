"""Schema evolution: new fields become optional columns, and the widenings JSON can ask for."""

from __future__ import annotations

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from service.iceberg.conflicts import retry_on_conflict
from spark_jobs.schemas import field_count, within_limit

# Type changes schema evolution may make (Iceberg's allowed promotions that JSON can ask for).
WIDENINGS = {(pa.int32(), pa.int64()), (pa.float32(), pa.float64())}
EVOLVE_ATTEMPTS = 5


def schema_additions(current: pa.Schema | pa.StructType, incoming: pa.Schema | pa.StructType) -> list[pa.Field]:
    """What `incoming` has that `current` lacks: new fields (nested ones inside existing structs
    too) and allowed widenings. A field whose type differs otherwise keeps its committed type."""
    have = {field.name: field for field in current}
    additions = []
    for field in incoming:
        existing = have.get(field.name)
        if existing is None:
            additions.append(field.with_nullable(True))
        elif pa.types.is_struct(existing.type) and pa.types.is_struct(field.type):
            nested = schema_additions(existing.type, field.type)
            if nested:
                additions.append(pa.field(field.name, pa.struct(nested), nullable=True))
        elif (existing.type, field.type) in WIDENINGS:
            additions.append(pa.field(field.name, field.type, nullable=existing.nullable))
    return additions


def evolve_schema(catalog: Catalog, table: Table, incoming: pa.Schema, max_fields: int | None = None) -> tuple[Table, list[str]]:
    """Add the new fields of `incoming` to the table as optional columns, and apply widenings;
    with `max_fields`, only the new fields that keep the table within that many fields at any
    depth (field_count). Returns the table and the dotted names of the fields left out.

    Several writers may see the same new field at once: each retries on a conflict against the
    reloaded table, where the field then exists and nothing is left to add, so the first
    committed type wins (and the limit holds: each attempt counts the table as reloaded).
    """
    left_out: list[str] = []

    def attempt(current: Table) -> Table:
        schema = current.schema().as_arrow()
        additions = schema_additions(schema, incoming)
        if max_fields is not None:
            # Widenings change a column's type and add no field: only the rest counts.
            widened = [f for f in additions if f.name in schema.names and not pa.types.is_struct(f.type)]
            added, left_out[:] = within_limit([f for f in additions if f not in widened], max_fields - field_count(schema))
            additions = widened + added
        if not additions:
            return current
        with current.update_schema() as update:
            update.union_by_name(pa.schema(additions))
        return catalog.load_table(current.name())

    return retry_on_conflict(catalog, table, attempt, attempts=EVOLVE_ATTEMPTS), left_out
