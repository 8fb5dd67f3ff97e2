"""Calve with its Iceberg catalog and metadata DB in PostgreSQL (the SQL catalog through pyiceberg's
`load_catalog`), as a deployment beyond one machine runs it: ingest, pipelines with partitioned
and dynamic tables, the DLQ, schema evolution under two writers, and exactly-once under a
committer kill and two rival committers, all tests of the embedded default collected again here.
Skipped, saying why, when PostgreSQL is not reachable (CALVE_TEST_POSTGRES)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import postgres_database
from tests.integration.test_committer import (  # noqa: F401 - collected again, on PostgreSQL
    test_committer_killed_and_restarted_loses_and_duplicates_nothing,
    test_two_committers_never_commit_the_same_files,
)
from tests.integration.test_pipelines import (  # noqa: F401
    test_dlq_is_listed_filtered_paged_replayed_after_a_fix_and_purged,
    test_dynamic_table_names_create_one_table_each,
    test_processors_routes_and_a_partitioned_table,
    test_schema_evolution_adds_fields_while_two_writers_run,
)
from tests.integration.test_spine import test_every_body_format_is_committed  # noqa: F401

pytestmark = [pytest.mark.spark, pytest.mark.long]  # a deployment beyond the embedded default: make test-long runs it


@pytest.fixture
def stack_overrides() -> Iterator[dict[str, str]]:
    with postgres_database("calve_catalog") as catalog, postgres_database("calve_meta") as metadata:
        yield {"CALVE_CATALOG_URI": catalog, "CALVE_DATABASE_URL": metadata}


def test_the_tables_and_tenants_live_in_postgresql(stack) -> None:  # noqa: ANN001
    """The tests above ran on PostgreSQL, not on the embedded SQLite files."""
    with stack.client() as http:
        assert http.post("/logs?wait=true&timeout=60", json={"n": 1}).json()["status"] == "committed"
    catalog = stack.catalog()
    assert catalog.engine.dialect.name == "postgresql" and ("demo", "logs") in catalog.list_tables("demo")
    assert not (stack.data_dir / "catalog.db").exists() and not (stack.data_dir / "calve.db").exists()
