"""A small real Iceberg table for the unit tests of row changes and compaction (SQLite catalog,
files on disk): three data files of 100 rows each."""

from __future__ import annotations

import datetime
from pathlib import Path

import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import LongType, NestedField, StringType, TimestamptzType

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True), NestedField(2, "ts", TimestamptzType(), required=True),
    NestedField(3, "name", StringType(), required=False), identifier_field_ids=[1],
)
START = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)


def three_files(tmp_path: Path) -> Table:
    """A v2 table of three files: ids 0-99, 100-199 and 200-299, an hour apart per hundred ids."""
    catalog = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=(tmp_path / "wh").as_uri())
    catalog.create_namespace("n")
    table = catalog.create_table(("n", "t"), SCHEMA, properties={"format-version": "2"})
    for first in (0, 100, 200):
        ids = list(range(first, first + 100))
        table.append(pa.table({
            "id": pa.array(ids, pa.int64()), "ts": pa.array([START + datetime.timedelta(minutes=i * 0.6) for i in ids], pa.timestamp("us", "UTC")),
            "name": pa.array([f"n{i}" for i in ids]),
        }, schema=SCHEMA.as_arrow()))
    return table
