"""The Iceberg catalog and what Calve reads from its tables.

Each tenant owns one namespace, named after the tenant. The SQL catalog on SQLite is the embedded
default; any pyiceberg catalog URI works the same way.
"""

from __future__ import annotations

import sqlite3
import time
from functools import lru_cache

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException, NamespaceAlreadyExistsError, NoSuchTableError, ServiceUnavailableError, TableAlreadyExistsError
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionSpec
from pyiceberg.io.pyarrow import compute_statistics_plan, data_file_statistics_from_parquet_metadata, parquet_path_to_id_mapping
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.table import Table, TableProperties, Transaction
from pyiceberg.typedef import Record
from pyiceberg.table.snapshots import Snapshot
from sqlalchemy import event
from sqlalchemy.exc import DatabaseError, IntegrityError, InterfaceError, OperationalError

from service.core.config import Settings
from service.core.keys import SUMMARY_WATERMARK

CATALOG_NAME = "calve"

# pyiceberg retries a conflicting append by re-applying it on the refreshed table. That would
# bypass the watermark check and commit files a rival leader already committed, so Calve turns
# it off and handles conflicts itself (reload, re-filter, retry).
COMMIT_RETRIES_PROPERTY = "commit.retry.num-retries"
TABLE_PROPERTIES = {
    COMMIT_RETRIES_PROPERTY: "0",
    # Keep the metadata directory bounded: one JSON file per commit otherwise piles up forever.
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "50",
}


CATALOG_INIT_ATTEMPTS = 5


# The catalog cannot be reached right now (as opposed to refusing a request): callers wait and
# retry, keeping their work, instead of failing it.
CATALOG_UNAVAILABLE: tuple[type[Exception], ...] = (OperationalError, InterfaceError, ServiceUnavailableError)


def open_catalog(settings: Settings) -> Catalog:
    return get_catalog(settings.resolved_catalog_uri(), settings.resolved_warehouse(), settings.catalog_busy_timeout_ms)


@lru_cache(maxsize=4)
def get_catalog(uri: str, warehouse: str, busy_timeout_ms: int = 30_000) -> Catalog:
    for attempt in range(1, CATALOG_INIT_ATTEMPTS + 1):
        try:
            catalog = SqlCatalog(CATALOG_NAME, uri=uri, warehouse=warehouse)
            break
        except DatabaseError:
            # Roles starting together on a fresh catalog all create its tables; the losers fail
            # with "already exists" and find the tables in place on the next try.
            if attempt == CATALOG_INIT_ATTEMPTS:
                raise
            time.sleep(0.2 * attempt)
    if uri.startswith("sqlite"):
        _tune_sqlite(catalog, busy_timeout_ms)
    return catalog


def _tune_sqlite(catalog: SqlCatalog, busy_timeout_ms: int) -> None:
    # Several processes commit to one SQLite file: WAL and a busy timeout turn lock contention
    # into short waits instead of "database is locked" failures.
    engine = catalog.engine

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_connection: sqlite3.Connection, _record: object) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        cursor.close()

    engine.dispose()


def table_identifier(tenant: str, table: str) -> tuple[str, str]:
    return (tenant, table)


def ensure_namespace(catalog: Catalog, tenant: str) -> None:
    try:
        catalog.create_namespace(tenant)
    except NamespaceAlreadyExistsError:
        pass
    except IntegrityError:
        # Two processes created it at once: the SQL catalog's check-then-insert lets both past
        # the check, and the loser hits the unique key instead of NamespaceAlreadyExistsError.
        if not catalog.namespace_exists(tenant):
            raise


def load_table(catalog: Catalog, tenant: str, table: str) -> Table | None:
    try:
        return catalog.load_table(table_identifier(tenant, table))
    except NoSuchTableError:
        return None


def create_table_once(catalog: Catalog, tenant: str, table: str, schema, partition_spec: PartitionSpec | None = None) -> Table:  # noqa: ANN001 - pyarrow or Iceberg schema
    """Create the table, or load it when another writer created it first."""
    ensure_namespace(catalog, tenant)
    try:
        return catalog.create_table(
            table_identifier(tenant, table), schema=schema, partition_spec=partition_spec or UNPARTITIONED_PARTITION_SPEC,
            properties=TABLE_PROPERTIES,
        )
    except (TableAlreadyExistsError, IntegrityError):  # IntegrityError: the same race as above
        return catalog.load_table(table_identifier(tenant, table))


def ensure_commit_properties(table: Table) -> Table:
    """Make a table created elsewhere safe for Calve's committer (see TABLE_PROPERTIES)."""
    if table.properties.get(COMMIT_RETRIES_PROPERTY) == "0":
        return table
    with table.transaction() as transaction:
        transaction.set_properties({COMMIT_RETRIES_PROPERTY: "0"})
    return table


def calve_snapshots(table: Table) -> list[Snapshot]:
    """Snapshots that Calve's committer made, newest first.

    Walks the current branch's ancestry, so a maintenance commit on top (which carries no
    watermark) does not hide the last watermark.
    """
    snapshots: list[Snapshot] = []
    snapshot = table.current_snapshot()
    while snapshot is not None:
        if snapshot.summary is not None and SUMMARY_WATERMARK in snapshot.summary.additional_properties:
            snapshots.append(snapshot)
        if snapshot.parent_snapshot_id is None:
            break
        snapshot = table.snapshot_by_id(snapshot.parent_snapshot_id)
    return snapshots


def watermark(table: Table) -> str:
    """The last commit-stream entry id already in the table ("0-0" when none is)."""
    for snapshot in calve_snapshots(table):
        return snapshot.summary.additional_properties[SUMMARY_WATERMARK]
    return "0-0"


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
    for attempt in range(1, EVOLVE_ATTEMPTS + 1):
        additions = schema_additions(table.schema().as_arrow(), incoming)
        if not additions:
            return table
        try:
            with table.update_schema() as update:
                update.union_by_name(pa.schema(additions))
            return catalog.load_table(table.name())
        except CommitFailedException:
            if attempt == EVOLVE_ATTEMPTS:
                raise
            table = catalog.load_table(table.name())
    return table


def append_files(transaction: Transaction, files: list[str], snapshot_properties: dict[str, str]) -> None:
    """Append Parquet files (written by Spark, so without field ids) in one fast append.

    pyiceberg's `add_files` derives each file's partition from its column statistics, which works
    for order-preserving transforms only. For bucket partitions the writer made every file hold
    one bucket; its value is computed here from the file's own values (and checked to be one).
    """
    spec = transaction.table_metadata.spec()
    if all(field.transform.preserves_order for field in spec.fields):
        # The watermark already excludes files the table has; scanning every manifest for
        # duplicates would make each commit slower than the last.
        transaction.add_files(files, snapshot_properties=snapshot_properties, check_duplicate_files=False)
        return
    if transaction.table_metadata.name_mapping() is None:
        transaction.set_properties(**{TableProperties.DEFAULT_NAME_MAPPING: transaction.table_metadata.schema().name_mapping.model_dump_json()})
    data_files = [_data_file(transaction, path) for path in files]
    with transaction.update_snapshot(snapshot_properties=snapshot_properties).fast_append() as append:
        for data_file in data_files:
            append.append_data_file(data_file)


def _data_file(transaction: Transaction, path: str) -> DataFile:
    metadata = transaction.table_metadata
    schema = metadata.schema()
    input_file = transaction._table.io.new_input(path)  # noqa: SLF001 - the table's own FileIO
    with input_file.open() as stream:
        parquet_metadata = pq.read_metadata(stream)
    statistics = data_file_statistics_from_parquet_metadata(
        parquet_metadata=parquet_metadata,
        stats_columns=compute_statistics_plan(schema, metadata.properties),
        parquet_column_mapping=parquet_path_to_id_mapping(schema),
    )
    values = []
    for field in metadata.spec().fields:
        if field.transform.preserves_order:
            values.append(statistics._partition_value(field, schema))  # noqa: SLF001 - what add_files does
        else:
            values.append(_partition_from_values(transaction, path, field, schema))
    return DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=Record(*values),
        file_size_in_bytes=len(input_file),
        sort_order_id=None,
        spec_id=metadata.default_spec_id,
        equality_ids=None,
        key_metadata=None,
        **statistics.to_serialized_dict(),
    )


def _partition_from_values(transaction: Transaction, path: str, field, schema):  # noqa: ANN001, ANN202
    source = schema.find_field(field.source_id)
    with transaction._table.io.new_input(path).open() as stream:  # noqa: SLF001
        column = pq.read_table(stream, columns=[source.name]).column(source.name)
    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.int64())
    elif pa.types.is_date(column.type):
        column = column.cast(pa.int32())
    transform = field.transform.transform(source.field_type)
    found = {transform(value) for value in pc.unique(column).to_pylist() if value is not None}
    if len(found) > 1:
        raise ValueError(f"{path} holds {len(found)} values of partition {field.name}; the writer must write one per file")
    return found.pop() if found else None
