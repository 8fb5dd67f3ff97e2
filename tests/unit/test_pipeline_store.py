"""The pipeline store against a real SQLite metadata DB: table-fed pipelines found by one indexed
query, each stored version parsed once per process, and definitions stored under older rules
still readable when a limit is added."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from sqlmodel import Session

from service.core.db import get_engine, migrate
from service.core.exceptions import DefinitionInvalid
from service.core.models import Pipeline, PipelineVersion
from service.pipelines import store
from service.pipelines.expressions import MAX_DEFINITION_EXPRESSIONS
from service.pipelines.spec import PipelineDefinition, parse_definition
from service.tenancy.tenants import create_tenant


@pytest.fixture
def session(tmp_path: Path) -> Session:
    url = f"sqlite:///{tmp_path / 'calve.db'}"
    migrate(url)
    with Session(get_engine(url)) as session:
        create_tenant(session, "demo")
        create_tenant(session, "beta")
        yield session


def fed(name: str, table: str) -> PipelineDefinition:
    return parse_definition({"name": name, "source": {"table": table}, "sinks": [{"table": f"{name}_out", "auto_create": True}]})


def http(name: str) -> PipelineDefinition:
    return parse_definition({"name": name, "source": {"http": {"path": f"/{name}"}}, "sinks": [{"table": name, "auto_create": True}]})


def test_the_pipelines_every_table_feeds_are_found_at_once_without_parsing_the_others(session: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    store.create_pipeline(session, "demo", fed("copy", "orders"))
    store.create_pipeline(session, "demo", fed("other", "users"))
    store.create_pipeline(session, "beta", fed("theirs", "orders"))
    for i in range(5):
        store.create_pipeline(session, "demo", http(f"p{i}"))
    store.replace_pipeline(session, "demo", "other", fed("other", "orders"))  # now reads orders
    store.delete_pipeline(session, "demo", "copy")
    store._PARSED.clear()
    parsed = []
    real = PipelineDefinition.model_validate
    monkeypatch.setattr(PipelineDefinition, "model_validate", lambda data, **kw: parsed.append(data["name"]) or real(data, **kw))
    for _round in range(2):
        feeds = store.table_feeds(session)
        assert {key: [r.name for r in records] for key, records in feeds.items()} == {("demo", "orders"): ["other"], ("beta", "orders"): ["theirs"]}
    assert sorted(parsed) == ["other", "theirs"], "only the definitions of pipelines a table feeds, and once per version"


def test_a_definition_stored_before_a_limit_was_added_is_still_read(session: Session) -> None:
    routes = {f"r{i}": " OR ".join(["a = 1"] * 100) for i in range(50)}
    data = {"name": "heavy", "source": {"http": {"path": "/heavy"}}, "routes": routes, "sinks": [{"table": "t", "auto_create": True}]}
    assert sum(map(len, routes.values())) > MAX_DEFINITION_EXPRESSIONS
    with pytest.raises(ValueError, match="at most"):
        parse_definition(data)
    # As an older Calve stored it:
    pipeline = Pipeline(tenant_id=1, name="heavy", path="/heavy", version=1)
    session.add(pipeline)
    session.flush()
    session.add(PipelineVersion(pipeline_id=pipeline.id, version=1, definition=orjson.dumps(data).decode()))
    session.commit()
    assert store.get_pipeline(session, "demo", "heavy").definition.routes == routes


def test_a_tenant_has_at_most_its_limit_of_live_pipelines(session: Session) -> None:
    for i in range(3):
        store.create_pipeline(session, "demo", http(f"p{i}"), max_pipelines=3)
    with pytest.raises(DefinitionInvalid, match="CALVE_MAX_PIPELINES_PER_TENANT"):
        store.create_pipeline(session, "demo", http("p3"), max_pipelines=3)
    store.create_pipeline(session, "beta", http("p3"), max_pipelines=3)  # another tenant's own count
    store.delete_pipeline(session, "demo", "p0")
    store.create_pipeline(session, "demo", http("p3"), max_pipelines=3)
