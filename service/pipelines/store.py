"""Pipelines in the metadata DB: versioned definitions, looked up by name or by HTTP path.

Every tenant has the built-in pipelines until it stores its own definition under their names,
which then replaces one like any other new version: `logs` at `/logs` (every event into the table
`logs`, created from the first batch; fields it lacks are kept in its `_extra` map column), `otel_logs` at `/otel_logs` and `loki_logs` at `/loki_logs`
(what `POST /otlp/v1/logs` and `POST /loki/api/v1/push` turn into events: OpenTelemetry log records
and Loki log lines, each into a table of its name with a declared schema, partitioned by day).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import orjson
from cachetools import LRUCache, TTLCache
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, func, select

from service.core.exceptions import AlreadyExists, DefinitionInvalid, NotFound, SpecError
from service.core.gates import LoadGates, RefreshAhead
from service.core.keys import (
    DEFAULT_PIPELINE,
    DEFAULT_PIPELINE_PATH,
    DEFAULT_TABLE,
    LOKI_LOGS_PIPELINE,
    OTEL_LOGS_PIPELINE,
)
from service.core.models import (
    PIPELINE_CONSUMER_PREFIX,
    ChangeConsumer,
    Pipeline,
    PipelineVersion,
    Tenant,
    utcnow,
)
from service.pipelines.expressions import stored
from service.pipelines.loki import LOKI_LOGS_SCHEMA
from service.pipelines.otel import OTEL_LOGS_SCHEMA
from service.pipelines.spec import PipelineDefinition, parse_definition
from service.tenancy.tenants import tenant_id as _tenant_id

LOGS_EXTRA_FIELDS = "_extra"  # the built-in logs table's column of the fields no other column takes
BUILTIN_DEFINITIONS = {
    DEFAULT_PIPELINE: {
        "name": DEFAULT_PIPELINE,
        "source": {"http": {"path": DEFAULT_PIPELINE_PATH}},
        # Not evolving: measured, evolution cost ~15% of make bench's events/s and let a poisoning
        # tenant slow the others' wait=true median 2.5x (make chaos). Fields the table lacks are
        # kept in one map column instead, so that nothing sent is lost.
        "sinks": [{"table": DEFAULT_TABLE, "auto_create": True, "extra_fields": LOGS_EXTRA_FIELDS}],
    },
    **{
        name: {"name": name, "source": {"http": {"path": f"/{name}"}}, "sinks": [{"table": name, "auto_create": True, "schema": schema}]}
        for name, schema in ((OTEL_LOGS_PIPELINE, OTEL_LOGS_SCHEMA), (LOKI_LOGS_PIPELINE, LOKI_LOGS_SCHEMA))
    },
}
BUILTIN_PATHS = {definition["source"]["http"]["path"]: name for name, definition in BUILTIN_DEFINITIONS.items()}


@dataclass(frozen=True)
class PipelineRecord:
    name: str
    version: int  # 0: the built-in default
    path: str | None
    definition: PipelineDefinition
    created_at: datetime | None = None
    deleted: bool = False

    @property
    def builtin(self) -> bool:
        return self.version == 0

    def public(self) -> dict:
        return {
            "name": self.name,
            "version": self.version,
            "path": self.path,
            "builtin": self.builtin,
            "deleted": self.deleted,
            "created_at": self.created_at,
            "definition": self.definition.model_dump(by_alias=True, exclude_none=True, exclude_defaults=True),
        }


def builtin_pipeline(name: str = DEFAULT_PIPELINE) -> PipelineRecord:
    definition = BUILTIN_DEFINITIONS[name]
    return PipelineRecord(name, 0, definition["source"]["http"]["path"], parse_definition(definition))


# Stored definitions as parsed, by their text: a version never changes, so each is parsed once
# per process however often it is read (a table's leader asks which pipelines it feeds every tick).
_PARSED: LRUCache = LRUCache(maxsize=1024)
_PARSED_LOCK = threading.Lock()


def stored_definition(text: str) -> PipelineDefinition:
    key = hashlib.sha256(text.encode()).digest()  # not the text itself: a definition may hold 256 KiB
    with _PARSED_LOCK:
        definition = _PARSED.get(key)
    if definition is None:
        with stored():
            definition = PipelineDefinition.model_validate(orjson.loads(text))
        with _PARSED_LOCK:
            _PARSED[key] = definition
    return definition


def _record(pipeline: Pipeline, version: PipelineVersion) -> PipelineRecord:
    return PipelineRecord(
        name=pipeline.name,
        version=version.version,
        path=pipeline.path,
        definition=stored_definition(version.definition),
        created_at=version.created_at,
        deleted=pipeline.deleted_at is not None,
    )


def _stored(session: Session, tenant_id: int, name: str) -> Pipeline | None:
    return session.exec(select(Pipeline).where(Pipeline.tenant_id == tenant_id, Pipeline.name == name)).first()


def _version(session: Session, pipeline: Pipeline, version: int) -> PipelineVersion | None:
    return session.exec(
        select(PipelineVersion).where(PipelineVersion.pipeline_id == pipeline.id, PipelineVersion.version == version)
    ).first()


def _path_owner(session: Session, tenant_id: int, path: str) -> str | None:
    owner = session.exec(select(Pipeline).where(Pipeline.tenant_id == tenant_id, Pipeline.path == path)).first()
    if owner is not None:
        return owner.name
    builtin = BUILTIN_PATHS.get(path)
    if builtin is not None and _stored(session, tenant_id, builtin) is None:
        return builtin  # a built-in holds its path until a stored version of it replaces it
    return None


def _http_path(definition: PipelineDefinition) -> str | None:
    return definition.source.http.path if definition.source.http is not None else None  # None: fed by a table


def _check_path(session: Session, tenant_id: int, definition: PipelineDefinition) -> None:
    if definition.source.http is None:
        return
    owner = _path_owner(session, tenant_id, definition.source.http.path)
    if owner is not None and owner != definition.name:
        raise DefinitionInvalid(
            [SpecError("source.http.path", f"{definition.source.http.path} is the path of pipeline {owner!r}; choose another")]
        )


def _store_version(session: Session, pipeline: Pipeline, definition: PipelineDefinition) -> PipelineRecord:
    body = orjson.dumps(definition.model_dump(by_alias=True, exclude_none=True)).decode()
    version = PipelineVersion(pipeline_id=pipeline.id, version=pipeline.version, definition=body)
    session.add(version)
    try:
        session.commit()
    except IntegrityError as exc:
        session.rollback()
        # Two writes of the same pipeline at once: one got the version (or the path) first.
        raise AlreadyExists(f"pipeline {definition.name!r} was changed at the same time; read it and retry") from exc
    session.refresh(pipeline)
    session.refresh(version)
    return _record(pipeline, version)


def create_pipeline(session: Session, tenant: str, definition: PipelineDefinition, max_pipelines: int | None = None) -> PipelineRecord:
    tenant_id = _tenant_id(session, tenant)
    existing = _stored(session, tenant_id, definition.name)
    if existing is not None and existing.deleted_at is None:
        raise AlreadyExists(f"pipeline {definition.name!r} exists; PUT /v1/pipelines/{definition.name} makes a new version")
    _check_path(session, tenant_id, definition)
    if existing is not None:  # created again after a delete: its history goes on
        return _new_version(session, existing, definition)
    live = session.exec(select(func.count()).select_from(Pipeline).where(Pipeline.tenant_id == tenant_id, Pipeline.deleted_at.is_(None))).one()
    if max_pipelines is not None and live >= max_pipelines:
        raise DefinitionInvalid([SpecError("name", f"the tenant has {live} pipelines, its limit (CALVE_MAX_PIPELINES_PER_TENANT); "
                                           "delete one it no longer needs, or route more events through one pipeline")])
    pipeline = Pipeline(tenant_id=tenant_id, name=definition.name, path=_http_path(definition), version=1,
                        source_table=definition.source.table)
    session.add(pipeline)
    try:
        session.flush()
    except IntegrityError as exc:
        session.rollback()
        raise AlreadyExists(f"pipeline {definition.name!r} (or its path) was created at the same time") from exc
    return _store_version(session, pipeline, definition)


def _new_version(session: Session, pipeline: Pipeline, definition: PipelineDefinition) -> PipelineRecord:
    _forget_feed(session, pipeline.tenant_id, pipeline.name, keep=definition.source.table)
    pipeline.version += 1
    pipeline.path = _http_path(definition)
    pipeline.source_table = definition.source.table
    pipeline.updated_at = utcnow()
    pipeline.deleted_at = None
    session.add(pipeline)
    return _store_version(session, pipeline, definition)


def replace_pipeline(session: Session, tenant: str, name: str, definition: PipelineDefinition) -> PipelineRecord:
    if definition.name != name:
        raise DefinitionInvalid([SpecError("name", f"the definition is named {definition.name!r}, the URL says {name!r}")])
    tenant_id = _tenant_id(session, tenant)
    existing = _stored(session, tenant_id, name)
    _check_path(session, tenant_id, definition)
    if existing is None:
        if name not in BUILTIN_DEFINITIONS:
            raise NotFound(f"no pipeline {name!r}; create it with POST /v1/pipelines")
        return create_pipeline(session, tenant, definition)  # the first stored version of the built-in
    if existing.deleted_at is not None:
        raise NotFound(f"pipeline {name!r} was deleted; create it again with POST /v1/pipelines")
    return _new_version(session, existing, definition)


def get_pipeline(session: Session, tenant: str, name: str, version: int | None = None) -> PipelineRecord:
    """The current (or a given) version; a deleted pipeline's versions stay readable."""
    tenant_id = _tenant_id(session, tenant)
    pipeline = _stored(session, tenant_id, name)
    if pipeline is None:
        if name in BUILTIN_DEFINITIONS and version in (None, 0):
            return builtin_pipeline(name)
        raise NotFound(f"no pipeline {name!r}")
    row = _version(session, pipeline, version if version is not None else pipeline.version)
    if row is None:
        raise NotFound(f"pipeline {name!r} has no version {version} (current: {pipeline.version})")
    return _record(pipeline, row)


def list_versions(session: Session, tenant: str, name: str) -> list[dict]:
    pipeline = _stored(session, _tenant_id(session, tenant), name)
    if pipeline is None:
        raise NotFound(f"no pipeline {name!r}")
    rows = session.exec(
        select(PipelineVersion).where(PipelineVersion.pipeline_id == pipeline.id).order_by(PipelineVersion.version)
    ).all()
    return [{"version": row.version, "created_at": row.created_at} for row in rows]


def list_pipelines(session: Session, tenant: str) -> list[PipelineRecord]:
    tenant_id = _tenant_id(session, tenant)
    pipelines = session.exec(
        select(Pipeline).where(Pipeline.tenant_id == tenant_id, Pipeline.deleted_at.is_(None)).order_by(Pipeline.name)
    ).all()
    records = [_record(p, _version(session, p, p.version)) for p in pipelines]
    builtins = [builtin_pipeline(name) for name in BUILTIN_DEFINITIONS if _stored(session, tenant_id, name) is None]
    return sorted(records + builtins, key=lambda record: record.name)


def table_feeds(session: Session) -> dict[tuple[str, str], list[PipelineRecord]]:
    """The live pipelines that read a table's changes, by (tenant, table), every tenant's in one
    query: a committer looks them up for each table it leads, and one query a table every few
    seconds kept an idle committer of 40 tables at ~2% of a core."""
    rows = session.exec(
        select(Tenant.name, Pipeline).join(Tenant, Tenant.id == Pipeline.tenant_id)
        .where(Pipeline.source_table.is_not(None), Pipeline.deleted_at.is_(None)).order_by(Pipeline.name)
    ).all()
    feeds: dict[tuple[str, str], list[PipelineRecord]] = {}
    for tenant, pipeline in rows:
        feeds.setdefault((tenant, pipeline.source_table), []).append(_record(pipeline, _version(session, pipeline, pipeline.version)))
    return feeds


def delete_pipeline(session: Session, tenant: str, name: str) -> PipelineRecord:
    tenant_id = _tenant_id(session, tenant)
    pipeline = _stored(session, tenant_id, name)
    if pipeline is None or pipeline.deleted_at is not None:
        if name in BUILTIN_DEFINITIONS and pipeline is None:
            raise AlreadyExists(f"the built-in pipeline {name!r} cannot be deleted; PUT /v1/pipelines/{name} replaces it")
        raise NotFound(f"no pipeline {name!r}")
    record = _record(pipeline, _version(session, pipeline, pipeline.version))
    pipeline.deleted_at = utcnow()
    pipeline.path = None
    session.add(pipeline)
    _forget_feed(session, tenant_id, name, keep=None)
    session.commit()
    return record


def _forget_feed(session: Session, tenant_id: int, name: str, keep: str | None) -> None:
    """Drop the pipeline's change feed consumer unless it reads table `keep`: a consumer nobody
    reads would hold its table's snapshots back from expiry."""
    consumers = session.exec(select(ChangeConsumer).where(
        ChangeConsumer.tenant_id == tenant_id, ChangeConsumer.name == PIPELINE_CONSUMER_PREFIX + name,
    )).all()
    for consumer in consumers:
        if consumer.table_name != keep:
            session.delete(consumer)


def find_by_path(session: Session, tenant: str, path: str) -> PipelineRecord | None:
    """The live pipeline that producers reach at `path`, or None."""
    tenant_id = _tenant_id(session, tenant)
    pipeline = session.exec(select(Pipeline).where(Pipeline.tenant_id == tenant_id, Pipeline.path == path)).first()
    if pipeline is not None:
        return _record(pipeline, _version(session, pipeline, pipeline.version))
    builtin = BUILTIN_PATHS.get(path)
    if builtin is not None and _stored(session, tenant_id, builtin) is None:
        return builtin_pipeline(builtin)
    return None


MISSING = object()


class PipelineCache:
    """Recently looked-up pipelines, by (tenant, path) for the api (and (tenant, "name:" + name)
    for `_bulk`'s indexes) and (tenant, name) for writers.

    Kept `ttl_s`; the api also clears it when any api announces a change on PIPELINES_CHANNEL, so a
    new version reaches producers at once there and within `ttl_s` in writers.
    """

    def __init__(self, ttl_s: float, maxsize: int = 10_000) -> None:
        self._cache: TTLCache = TTLCache(maxsize=maxsize, ttl=ttl_s)
        self._lock = threading.Lock()
        self._gates = LoadGates()
        self._ahead = RefreshAhead(ttl_s, maxsize)

    def cached(self, key: tuple[str, str]) -> PipelineRecord | None | object:
        """The kept record (None: no pipeline there), or MISSING when it is not kept."""
        with self._lock:
            # One lookup: `key in cache` then `cache[key]` raised KeyError when the entry expired
            # in between (a TTLCache checks the clock on each), a 500 for the request.
            return self._cache.get(key, MISSING)

    def get(self, key: tuple[str, str], load: Callable[[], PipelineRecord | None]) -> PipelineRecord | None:
        """The kept record, else `load()`'s, one load per key at a time (LoadGates)."""
        record = self.cached(key)
        if record is not MISSING:
            return record
        with self._gates.one_at_a_time(key):
            record = self.cached(key)
            if record is MISSING:
                generation = self._ahead.generation
                record = load()
                with self._lock:
                    self._ahead.keep(self._cache, key, record, generation)
        return record

    def due(self, key: tuple[str, str]) -> bool:
        """Whether the kept record is past half its time and not being looked up again: the
        caller then calls refresh(), once (RefreshAhead)."""
        with self._lock:
            return key in self._cache and self._ahead.due(key)

    def refresh(self, key: tuple[str, str], load: Callable[[], PipelineRecord | None]) -> None:
        """`load()`'s record kept anew for the key (unless the cache was cleared meanwhile)."""
        generation = self._ahead.generation
        try:
            record = load()
            with self._lock:
                self._ahead.keep(self._cache, key, record, generation)
        finally:
            with self._lock:
                self._ahead.done(key)

    def forget(self, key: tuple[str, str]) -> None:
        with self._lock:
            self._cache.pop(key, None)
            self._ahead.forget(key)

    def clear(self) -> None:
        with self._lock:
            self._cache.clear()
            self._ahead.clear()
