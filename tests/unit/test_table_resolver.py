"""The writer's TableResolver against a real SQLite catalog, for the answers that read no rows
(rows are read only to create or evolve a table from a batch: those run on Spark, end to end)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog

from service.iceberg.catalog import create_table_once, get_catalog
from service.pipelines.spec import PipelineDefinition
from service.writer.tables import TableResolver
from spark_jobs.targets import Target


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    return get_catalog.__wrapped__(f"sqlite:///{tmp_path / 'catalog.db'}", (tmp_path / "wh").as_uri())


def definition(**sink: object) -> PipelineDefinition:
    return PipelineDefinition.model_validate({"name": "events", "source": {"http": {"path": "/events"}}, "sinks": [{"table": "events", **sink}]})


def counting_loads(catalog: Catalog, monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """Every load_table the catalog is asked for (each a round trip on a REST catalog)."""
    loads: list[tuple] = []
    real = catalog.load_table

    def load_table(identifier: tuple) -> object:
        loads.append(identifier)
        return real(identifier)

    monkeypatch.setattr(catalog, "load_table", load_table)
    return loads


def test_a_batch_loads_its_table_once_however_often_it_is_resolved(catalog: Catalog, monkeypatch: pytest.MonkeyPatch) -> None:
    create_table_once(catalog, "demo", "events", pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("msg", pa.string())]))
    resolver, pipeline = TableResolver(catalog), definition()
    loads = counting_loads(catalog, monkeypatch)
    resolver.new_batch()
    known = resolver.known_schema("demo", pipeline)
    first = resolver.resolve("demo", "events", pipeline.sinks[0], rows=None)  # the short way
    second = resolver.resolve("demo", "events", pipeline.sinks[0], rows=None)  # the Spark job after it
    assert known.names == ["id", "msg"]
    assert isinstance(first, Target) and isinstance(second, Target) and first.required == frozenset({"id"})
    assert first.directory != second.directory, "each resolve writes to a directory of its own"
    assert len(loads) == 1, loads
    resolver.new_batch()
    resolver.resolve("demo", "events", pipeline.sinks[0], rows=None)
    assert len(loads) == 2, "the next batch sees the table as it is then"


def test_a_table_that_may_not_be_created_or_named_sends_its_rows_to_the_dlq(catalog: Catalog) -> None:
    resolver = TableResolver(catalog)
    resolver.new_batch()
    pipeline = definition()
    assert "does not exist and the sink may not create it" in resolver.resolve("demo", "events", pipeline.sinks[0], rows=None)
    assert "is not valid" in resolver.resolve("demo", "_calve_x", pipeline.sinks[0], rows=None)
    assert resolver.known_schema("demo", pipeline) is None


def test_a_sink_that_changes_rows_needs_identifier_columns_the_table_has(catalog: Catalog) -> None:
    create_table_once(catalog, "demo", "events", pa.schema([pa.field("id", pa.int64(), nullable=False)]))
    resolver = TableResolver(catalog)
    resolver.new_batch()
    keyless = definition(mode="upsert")
    assert "has no identifier fields" in resolver.resolve("demo", "events", keyless.sinks[0], rows=None)
    keyed = definition(mode="upsert", identifier_columns=["id"])
    target = resolver.resolve("demo", "events", keyed.sinks[0], rows=None)
    assert target.changes is not None and target.changes.keys == ("id",) and target.changes.upsert
    assert "/changes-" in target.directory


def test_the_extra_fields_column_is_added_to_a_table_that_lacks_it(catalog: Catalog) -> None:
    create_table_once(catalog, "demo", "events", pa.schema([pa.field("msg", pa.string())]))
    resolver = TableResolver(catalog)
    resolver.new_batch()
    target = resolver.resolve("demo", "events", definition(extra_fields="extra").sinks[0], rows=None)
    extra = target.schema.field("extra").type
    assert target.extra_fields == "extra" and pa.types.is_map(extra)
    assert all(pa.types.is_string(t) or pa.types.is_large_string(t) for t in (extra.key_type, extra.item_type))
    assert "extra" in catalog.load_table(("demo", "events")).schema().column_names


def test_an_evolving_table_is_taken_as_it_is_without_rows_and_only_a_plain_evolving_sink_is_one(catalog: Catalog) -> None:
    resolver = TableResolver(catalog)
    resolver.new_batch()
    evolving = definition(auto_create=True, schema_evolution=True)
    assert not resolver.evolving_table("demo", evolving), "no table yet: the Spark job creates it from the rows"
    assert resolver.resolve("demo", "events", evolving.sinks[0], rows=None) is None
    create_table_once(catalog, "demo", "events", pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("msg", pa.string())]))
    resolver.new_batch()
    assert resolver.evolving_table("demo", evolving)
    target = resolver.resolve("demo", "events", evolving.sinks[0], rows=None)
    assert isinstance(target, Target) and target.schema.names == ["id", "msg"] and target.extra_fields is None
    assert catalog.load_table(("demo", "events")).schema().schema_id == 0, "nothing evolved"
    filtered = PipelineDefinition.model_validate({"name": "events", "source": {"http": {"path": "/events"}},
                                                   "processors": [{"where": "id > 1"}], "sinks": [{"table": "events", "schema_evolution": True}]})
    assert resolver.evolving_table("demo", filtered), "processors: the short way plans them"
    routed = PipelineDefinition.model_validate({"name": "events", "source": {"http": {"path": "/events"}}, "routes": {"all": "true"},
                                                "sinks": [{"table": "events", "schema_evolution": True, "routes": ["all"]}]})
    for other in (definition(schema_evolution=True, extra_fields="extra"), definition(schema_evolution=True, mode="upsert", identifier_columns=["id"]),
                  definition(), routed):
        assert not resolver.evolving_table("demo", other), other
