"""Schema evolution: new fields become optional columns, and the widenings JSON can ask for."""

from __future__ import annotations

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from service.iceberg.conflicts import retry_on_conflict

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


def evolve_schema(catalog: Catalog, table: Table, incoming: pa.Schema) -> Table:
    """Add the new fields of `incoming` to the table as optional columns, and apply widenings.

    Several writers may see the same new field at once: each retries on a conflict against the
    reloaded table, where the field then exists and nothing is left to add, so the first
    committed type wins.
    """
    def attempt(current: Table) -> Table:
        additions = schema_additions(current.schema().as_arrow(), incoming)
        if not additions:
            return current
        with current.update_schema() as update:
            update.union_by_name(pa.schema(additions))
        return catalog.load_table(current.name())

    return retry_on_conflict(catalog, table, attempt, attempts=EVOLVE_ATTEMPTS)
