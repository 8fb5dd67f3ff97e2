"""Opening the Iceberg catalog, and the tables and namespaces Calve makes in it.

Each tenant owns one namespace, named after the tenant. The catalog is opened with pyiceberg's own
`load_catalog`, so any catalog it knows works: `CALVE_CATALOG_URI` picks it (sqlite:// or
postgresql:// for the SQL catalog, http(s):// for a REST catalog, thrift:// for Hive),
`CALVE_CATALOG_TYPE` names the type when the URI does not say it (glue, nessie via rest, ...),
and `CALVE_CATALOG_PROPERTIES` (JSON) or pyiceberg's own `.pyiceberg.yaml` and
`PYICEBERG_CATALOG__CALVE__*` variables add any property. The embedded default is the SQL catalog
on SQLite.
"""

from __future__ import annotations

from functools import lru_cache

from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import (
    NamespaceAlreadyExistsError,
    NoSuchTableError,
    ServiceUnavailableError,
    TableAlreadyExistsError,
)
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionSpec
from pyiceberg.table import Table
from sqlalchemy.exc import (
    DatabaseError,
    IntegrityError,
    InterfaceError,
    OperationalError,
)
from tenacity import (
    retry,
    retry_if_exception,
    retry_if_exception_type,
    stop_after_attempt,
    wait_incrementing,
)

from service.core.config import Settings
from service.core.db import share_sqlite
from service.core.keys import RESERVED_TABLE_PREFIX
from service.iceberg import private
from service.iceberg.conflicts import retry_on_conflict

CATALOG_NAME = "calve"

# pyiceberg retries a conflicting append by re-applying it on the refreshed table. That would
# bypass the watermark check and commit files a rival leader already committed, so Calve turns
# it off and handles conflicts itself (reload, re-filter, retry).
COMMIT_RETRIES_PROPERTY = "commit.retry.num-retries"
# Every commit merges small manifests into larger ones (pyiceberg's merge append), so a table's
# manifest count stays bounded however many commits it has had; without it each fast append adds
# one manifest forever, and every later commit and scan reads them all.
MANIFEST_MERGE_PROPERTIES = {"commit.manifest-merge.enabled": "true", "commit.manifest.min-count-to-merge": "20"}
# What Calve's committer needs of a table, whoever created it.
REQUIRED_PROPERTIES = {COMMIT_RETRIES_PROPERTY: "0", **MANIFEST_MERGE_PROPERTIES}
TABLE_PROPERTIES = {
    **REQUIRED_PROPERTIES,
    # Keep the metadata directory bounded: one JSON file per commit otherwise piles up forever.
    "write.metadata.delete-after-commit.enabled": "true",
    "write.metadata.previous-versions-max": "50",
}


CATALOG_INIT_ATTEMPTS = 5


# The catalog cannot be reached right now (as opposed to refusing a request): callers wait and
# retry, keeping their work, instead of failing it.
CATALOG_UNAVAILABLE: tuple[type[Exception], ...] = (OperationalError, InterfaceError, ServiceUnavailableError)


def open_catalog(settings: Settings) -> Catalog:
    return get_catalog(
        settings.resolved_catalog_uri(), settings.resolved_warehouse(), settings.catalog_busy_timeout_ms,
        settings.catalog_type, tuple(sorted(settings.catalog_properties.items())),
    )


@lru_cache(maxsize=4)
def get_catalog(
    uri: str, warehouse: str, busy_timeout_ms: int = 30_000, catalog_type: str | None = None,
    properties: tuple[tuple[str, str], ...] = (),
) -> Catalog:
    config = {"uri": uri, "warehouse": warehouse, **dict(properties)}
    if catalog_type:
        config["type"] = catalog_type
    catalog = _load(config)
    if isinstance(catalog, SqlCatalog) and uri.startswith("sqlite"):
        _tune_sqlite(catalog, busy_timeout_ms)
    return catalog


# Roles starting together on a fresh SQL catalog all create its tables; the losers fail with
# "already exists" and find the tables in place on the next try.
@retry(
    retry=retry_if_exception_type(DatabaseError), stop=stop_after_attempt(CATALOG_INIT_ATTEMPTS),
    wait=wait_incrementing(start=0.2, increment=0.2), reraise=True,
)
def _load(config: dict[str, str]) -> Catalog:
    private.cache_transaction_metadata()
    private.share_updated_metadata()
    private.cache_metadata_files()
    return load_catalog(CATALOG_NAME, **config)


def _tune_sqlite(catalog: SqlCatalog, busy_timeout_ms: int) -> None:
    # Several processes commit to one SQLite file.
    share_sqlite(catalog.engine, busy_timeout_ms)
    catalog.engine.dispose()


# Calve's own tables (the DLQ) are named "_calve..." in Calve. Catalogs of the S3 Tables kind (AWS S3
# Tables, SeaweedFS's REST catalog) refuse a table name that does not start with a letter or digit:
# the catalog property `calve.own-table-prefix` (CALVE_CATALOG_PROPERTIES) spells them there with
# another prefix ("calve": the DLQ is `calve_dlq` in the catalog, still `_calve_dlq` in Calve's
# API), and the tenants' tables may then not start with that prefix.
OWN_PREFIX_PROPERTY = "calve.own-table-prefix"


def own_prefix(catalog: Catalog) -> str:
    return catalog.properties.get(OWN_PREFIX_PROPERTY) or RESERVED_TABLE_PREFIX


def table_identifier(catalog: Catalog, tenant: str, table: str) -> tuple[str, str]:
    """The catalog's identifier of Calve's table `table` of `tenant`."""
    if table.startswith(RESERVED_TABLE_PREFIX):
        table = own_prefix(catalog) + table[len(RESERVED_TABLE_PREFIX):]
    return (tenant, table)


def calve_table_name(catalog: Catalog, name: str) -> str:
    """Calve's name of the catalog's table `name` (the inverse of table_identifier)."""
    prefix = own_prefix(catalog)
    if prefix != RESERVED_TABLE_PREFIX and name.startswith(prefix):
        return RESERVED_TABLE_PREFIX + name[len(prefix):]
    return name


def is_reserved_table_name(catalog: Catalog, name: str) -> bool:
    """Whether `name` is (or would be spelled in the catalog as) one of Calve's own tables."""
    return name.startswith((RESERVED_TABLE_PREFIX, own_prefix(catalog)))


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
        return catalog.load_table(table_identifier(catalog, tenant, table))
    except NoSuchTableError:
        return None


def _sqlite_busy(exc: BaseException) -> bool:
    # SQLite answers "database is locked" at once, whatever the busy timeout, to a transaction that
    # read before it wrote while another wrote meanwhile (it cannot wait without deadlocking):
    # the SQL catalog's check-then-insert does that when writers create one table at once.
    return isinstance(exc, OperationalError) and "database is locked" in str(exc)


@retry(retry=retry_if_exception(_sqlite_busy), stop=stop_after_attempt(CATALOG_INIT_ATTEMPTS),
       wait=wait_incrementing(start=0.05, increment=0.05), reraise=True)
def create_table_once(catalog: Catalog, tenant: str, table: str, schema, partition_spec: PartitionSpec | None = None) -> Table:  # noqa: ANN001 - pyarrow or Iceberg schema
    """Create the table, or load it when another writer created it first."""
    ensure_namespace(catalog, tenant)
    try:
        return catalog.create_table(
            table_identifier(catalog, tenant, table), schema=schema, partition_spec=partition_spec or UNPARTITIONED_PARTITION_SPEC,
            properties=TABLE_PROPERTIES,
        )
    except (TableAlreadyExistsError, IntegrityError):  # IntegrityError: the same race as above
        return catalog.load_table(table_identifier(catalog, tenant, table))


def ensure_commit_properties(table: Table) -> Table:
    """Make a table created elsewhere (or by an older Calve) safe for Calve's committer (see
    REQUIRED_PROPERTIES)."""
    missing = {key: value for key, value in REQUIRED_PROPERTIES.items() if table.properties.get(key) != value}
    if not missing:
        return table
    with table.transaction() as transaction:
        transaction.set_properties(missing)
    return table


def set_table_properties(catalog: Catalog, table: Table, wanted: dict[str, str]) -> Table:
    """Give the table these properties (a no-op when it has them); a conflicting commit (the
    leader committing meanwhile) is retried on the reloaded table."""
    def attempt(current: Table) -> Table:
        changed = {key: value for key, value in wanted.items() if current.properties.get(key) != value}
        if changed:
            with current.transaction() as transaction:
                transaction.set_properties(changed)
        return current

    return retry_on_conflict(catalog, table, attempt, attempts=CATALOG_INIT_ATTEMPTS, wait=wait_incrementing(start=0.05, increment=0.05))


def set_identifier_fields(catalog: Catalog, table: Table, names: list[str]) -> Table:
    """Declare the columns that identify a row (a table Calve creates for row changes); another
    writer doing the same at once makes one of the two commits conflict, and the loser finds it done."""
    def attempt(current: Table) -> Table:
        if not current.schema().identifier_field_ids:
            with current.update_schema() as update:
                update.set_identifier_fields(*names)
        return catalog.load_table(current.name())

    return retry_on_conflict(catalog, table, attempt, attempts=CATALOG_INIT_ATTEMPTS)
