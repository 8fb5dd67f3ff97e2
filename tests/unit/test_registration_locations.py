"""Where a registered file may come from (service/iceberg/registration.py): one spelling per URI,
every spelling trick refused or folded before the prefix check."""

from __future__ import annotations

import pytest

from service.iceberg.registration import FileRefused, allowed_location, parse_location

TABLE = "s3://wh/demo/events"
WAREHOUSE = "s3://wh"
LANDING = ["s3://landing/demo/", "file:///srv/landing/demo"]


def allowed(path: str) -> str:
    return allowed_location(path, TABLE, LANDING, WAREHOUSE)


@pytest.mark.parametrize(("path", "uri"), [
    ("s3://wh/demo/events/data/in/a.parquet", "s3://wh/demo/events/data/in/a.parquet"),
    ("s3a://wh/demo/events/data/a.parquet", "s3://wh/demo/events/data/a.parquet"),
    ("S3N://wh/demo/events/data/a.parquet", "s3://wh/demo/events/data/a.parquet"),
    ("s3://landing/demo/2026/11/a b.parquet", "s3://landing/demo/2026/11/a b.parquet"),
    ("/srv/landing/demo/x.parquet", "file:///srv/landing/demo/x.parquet"),
    ("file:///srv/landing/demo/x.parquet", "file:///srv/landing/demo/x.parquet"),
])
def test_paths_under_the_tenants_prefixes_are_accepted_in_one_spelling(path: str, uri: str) -> None:
    assert allowed(path) == uri


@pytest.mark.parametrize("path", [
    "s3://wh/other/events/data/a.parquet",  # another tenant's table
    "s3://wh/demo/events/data/../../../other/events/data/a.parquet",  # climbing out
    "s3://wh/demo/events/data/./a.parquet",
    "s3://wh/demo/events/data//a.parquet",
    "s3://wh/demo/events/data/%2e%2e/%2e%2e/other/a.parquet",  # percent-escapes
    "s3://wh/demo/events/data%2fa.parquet",
    "s3://other-bucket/demo/events/data/a.parquet",  # a different bucket
    "s3a://wh/other/events/data/a.parquet",  # s3a:// is s3:// and still another tenant's
    "gs://wh/demo/events/data/a.parquet",  # another store with the same bucket name
    "s3://wh/demo/events/data",  # the prefix itself
    "s3://wh/demo/events/data-other/a.parquet",  # a sibling sharing the prefix's letters
    "s3://wh/demo/events/metadata/v1.metadata.json",  # the table, but not its data
    "s3://landing/demo-other/a.parquet",
    "s3://landing/demo",
    "/srv/landing/other/x.parquet",
    "demo/events/data/a.parquet",  # relative
    "s3://wh/demo/events/data\\..\\a.parquet",
    "s3://wh/demo/events/data/a.parquet\n",
])
def test_every_other_spelling_and_prefix_is_refused(path: str) -> None:
    with pytest.raises(FileRefused) as refused:
        allowed(path)
    assert refused.value.reason == "location"


@pytest.mark.parametrize("directory", ["batch-" + "0" * 32, "changes-" + "a1" * 16, "compact-" + "f" * 32, "_calve_feed"])
def test_the_directories_calves_own_writers_use_are_refused(directory: str) -> None:
    with pytest.raises(FileRefused, match="Calve's own writers"):
        allowed(f"s3://wh/demo/events/data/{directory}/part-0.parquet")
    if not directory.startswith("_"):  # every name starting with _calve is Calve's
        assert allowed(f"s3://wh/demo/events/data/{directory}x/part-0.parquet")  # a name of the user's own


def test_a_landing_prefix_inside_the_warehouse_grants_nothing_there() -> None:
    """An operator's grant that happens to cover the warehouse never opens another table's files."""
    with pytest.raises(FileRefused):
        allowed_location("s3://wh/other/events/data/a.parquet", TABLE, ["s3://wh/"], WAREHOUSE)


def test_parse_location_folds_scheme_aliases_and_keeps_the_rest() -> None:
    location = parse_location("s3a://Bucket/Key/With Spaces+plus.parquet")
    assert (location.scheme, location.netloc, location.parts) == ("s3", "Bucket", ("Key", "With Spaces+plus.parquet"))
