"""Calve with its warehouse in an S3 object store and its tables in an Iceberg REST catalog, both
served by SeaweedFS (started here): Spark's executors write and read the data files through
pyarrow (spark_jobs/files.py), pyiceberg writes the metadata, and the committer's commits are
the REST catalog's compare-and-swap. Tests of the embedded default are collected again here:
ingest of every body format, dynamic tables, the DLQ replayed and purged, exactly-once under a
committer kill, a partitioned table compacted, row changes, a change feed diffed on Spark, and
files written elsewhere registered from S3 event notifications."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyarrow import fs as pafs

from service.iceberg.files import catalog_io, locate
from tests.harness import SeaweedServer
from tests.integration.test_change_feed import (  # noqa: F401 - collected again, on S3 and REST
    test_a_large_snapshots_changes_come_from_spark_as_they_would_from_memory,
)
from tests.integration.test_committer import test_committer_killed_and_restarted_loses_and_duplicates_nothing  # noqa: F401
from tests.integration.test_compaction import test_partitioned_tables_compact_per_partition_and_keep_their_settings  # noqa: F401
from tests.integration.test_pipelines import (  # noqa: F401
    test_dlq_is_listed_filtered_paged_replayed_after_a_fix_and_purged,
    test_dynamic_table_names_create_one_table_each,
)
from tests.integration.test_registered_files import (  # noqa: F401
    test_files_from_three_writers_are_registered_once_each_under_ingest_and_a_committer_kill,
)
from tests.integration.test_row_changes import test_inserts_updates_and_deletes_apply_in_order_and_are_counted  # noqa: F401
from tests.integration.test_spine import test_every_body_format_is_committed  # noqa: F401

pytestmark = [pytest.mark.spark, pytest.mark.long]  # a deployment beyond the embedded default: make test-long runs it


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    server = SeaweedServer(tmp_path_factory.mktemp("seaweed")).start()
    yield server
    server.stop()


@pytest.fixture
def stack_overrides(seaweed: SeaweedServer) -> dict[str, str]:
    """Each test's tables in a warehouse of their own, as each has its own embedded catalog elsewhere."""
    return seaweed.overrides(seaweed.new_bucket(f"calve-{uuid.uuid4().hex[:12]}"))


def test_the_tables_data_and_metadata_live_in_the_object_store(stack) -> None:  # noqa: ANN001
    """The tests above ran on the REST catalog and S3, not on the embedded catalog and warehouse:
    a committed row's data file and the table's metadata are objects in the bucket, read back
    through S3, and nothing is under the data directory's warehouse."""
    with stack.client() as http:
        assert http.post("/logs?wait=true&timeout=60", json={"msg": "in s3"}).json()["status"] == "committed"
    catalog = stack.catalog()
    assert type(catalog).__name__ == "RestCatalog"
    table = catalog.load_table(("demo", "logs"))
    bucket = stack.settings.warehouse
    assert bucket.startswith("s3://calve-") and table.location().startswith(bucket) and table.metadata_location.startswith(bucket)
    files = table.inspect.files().column("file_path").to_pylist()
    assert files and all(path.startswith(f"{table.location()}/data/") for path in files)
    store, path = locate(files[0], catalog_io(catalog))
    assert isinstance(store, pafs.S3FileSystem) and store.get_file_info(path).size > 0
    assert [row["msg"] for row in stack.rows()] == ["in s3"]
    assert not (Path(stack.data_dir) / "warehouse").exists() and not (Path(stack.data_dir) / "catalog.db").exists()


def test_a_table_name_the_catalog_refuses_sends_its_rows_to_the_dlq_with_the_reason(stack) -> None:  # noqa: ANN001
    """S3 Tables names must start with a letter or digit: `_hidden` passes Calve's rule but not the
    catalog's, and its rows go to the DLQ with the catalog's reason instead of being retried
    forever; a name spelled like Calve's own tables there (`calve_...`) is refused by Calve; the
    other rows of the request are written."""
    from tests.integration.test_pipelines import create, dlq, send

    create(stack, {"name": "events", "source": {"http": {"path": "/events"}}, "sinks": [{"table": "${service}", "auto_create": True}]})
    answer = send(stack, "/events", [{"service": "_hidden", "n": 1}, {"service": "calve_dlq", "n": 2}, {"service": "pay", "n": 3}])
    assert answer["status"] == "committed" and answer["dlq_events"] == 2
    assert [row["n"] for row in stack.rows("pay")] == [3]
    reasons = sorted(row["reason"] for row in dlq(stack))
    assert "the catalog refused table '_hidden'" in reasons[1] and "'calve_dlq'" in reasons[0] and "is not valid" in reasons[0], reasons
