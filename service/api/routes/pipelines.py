"""/v1/pipelines: a tenant's admin defines where its events go (YAML or JSON, versioned)."""

from __future__ import annotations

import difflib
from typing import Any

import orjson
import yaml
from fastapi import APIRouter, Query, Request, status
from fastapi.concurrency import run_in_threadpool

from service.api.bodies import in_parsing_thread, read_body
from service.api.deps import (
    AdminPrincipal,
    CatalogDep,
    ReadPrincipal,
    RedisDep,
    SessionDep,
    SettingsDep,
    TableName,
)
from service.api.errors import AUTH_ERRORS, error_responses
from service.core import keys
from service.core.exceptions import BadRequestBody, DefinitionInvalid, SpecError
from service.core.keys import PIPELINES_CHANNEL
from service.iceberg.catalog import load_table
from service.pipelines.spec import PipelineDefinition, parse_definition
from service.pipelines.store import (
    create_pipeline,
    delete_pipeline,
    get_pipeline,
    list_pipelines,
    list_versions,
    replace_pipeline,
)

router = APIRouter(prefix="/v1/pipelines", tags=["pipelines"], responses=error_responses(*AUTH_ERRORS))
MAX_DEFINITION_BYTES = 256 * 1024
YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")
# The body is read by hand (YAML or JSON, checked with field-level errors), so it is declared here;
# the PipelineDefinition schema itself is added to the document's components by service.api.main.
DEFINITION_BODY = {
    "requestBody": {
        "required": True,
        "description": "a pipeline definition, as JSON or YAML (Content-Type: application/yaml)",
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/PipelineDefinition"}},
            "application/yaml": {"schema": {"type": "string"}},
        },
    }
}


class _NoAliasLoader(yaml.SafeLoader):
    """Safe YAML without anchors and aliases: a few aliases can expand into billions of nodes."""

    def compose_node(self, parent, index):  # noqa: ANN001, ANN202 - yaml.SafeLoader's own hook
        if self.check_event(yaml.AliasEvent):
            raise yaml.YAMLError("anchors and aliases (&, *) are not allowed in pipeline definitions")
        return super().compose_node(parent, index)


async def _definition(request: Request, tenant: str) -> PipelineDefinition:
    raw = await read_body(request, MAX_DEFINITION_BYTES)
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    # Parsing and checking a large definition takes a while (up to ~0.3 s within the limits): off
    # the event loop, one at a time per api process, so that the loop keeps most of the interpreter
    # (the GIL) for other tenants' requests however many definitions arrive at once, and the
    # tenants' in turn.
    return await in_parsing_thread(tenant, _parse, raw, content_type in YAML_TYPES)


def _parse(raw: bytes, is_yaml: bool) -> PipelineDefinition:
    try:
        data: Any = yaml.load(raw, Loader=_NoAliasLoader) if is_yaml else orjson.loads(raw)  # noqa: S506 - a SafeLoader
    except (yaml.YAMLError, orjson.JSONDecodeError) as exc:
        kind = "YAML" if is_yaml else "JSON (send Content-Type: application/yaml for YAML)"
        raise BadRequestBody(f"the definition is not valid {kind}: {str(exc).splitlines()[0]}") from None
    except RecursionError:
        raise BadRequestBody("the definition nests too deeply to be a pipeline definition") from None
    try:
        return parse_definition(data)
    except RecursionError:
        raise BadRequestBody("the definition nests too deeply to be a pipeline definition") from None


def _check_tables(catalog: CatalogDep, tenant: str, definition: PipelineDefinition) -> list[str]:
    """A static sink that may not create its table needs the table to exist now. Returns warnings:
    a sink whose existing copy-on-write table the merge-on-read default will switch."""
    errors, warnings = [], []
    for index, sink in enumerate(definition.sinks):
        # Loaded only where an answer depends on it: a sink that may not create its table, or one
        # whose row changes would switch the table's write mode.
        needed = not sink.dynamic and (not sink.auto_create or (sink.row_changes and sink.write_mode is None))
        table = load_table(catalog, tenant, sink.table) if needed else None
        if not sink.dynamic and not sink.auto_create and table is None:
            errors.append(SpecError(f"sinks[{index}].table",
                                    f"table {sink.table!r} does not exist and auto_create is false; create it or set auto_create: true"))
        if table is not None and sink.switches_to_merge_on_read(table.properties):
            warnings.append(
                f"sinks[{index}]: table {sink.table!r} is copy-on-write and this sink sets no write_mode, so its next change switches "
                "it to merge-on-read (the default): readers that cannot apply position deletes would see replaced and deleted rows. "
                "Set write_mode: copy-on-write to keep it, or merge-on-read to say so."
            )
    source = definition.source.table
    if source is not None and load_table(catalog, tenant, source) is None:
        errors.insert(0, SpecError("source.table", f"table {source!r} does not exist; a pipeline can read the changes of an existing table"))
    if errors:
        raise DefinitionInvalid(errors)
    return warnings


async def _announce(client: RedisDep, tenant: str, definition: PipelineDefinition) -> None:
    """Writers reload the tenant's pipelines; a table feeding one gets a leader (who pumps its feed)."""
    if definition.source.table is not None:
        await client.sadd(keys.TABLES, keys.member(tenant, definition.source.table))
    await client.publish(PIPELINES_CHANNEL, tenant.encode())


@router.post("", status_code=status.HTTP_201_CREATED, openapi_extra=DEFINITION_BODY, responses=error_responses(400, 409, 413, 422))
async def create(
    request: Request, principal: AdminPrincipal, session: SessionDep, catalog: CatalogDep, client: RedisDep, settings: SettingsDep,
) -> dict:
    definition = await _definition(request, principal.tenant)
    warnings = await run_in_threadpool(_check_tables, catalog, principal.tenant, definition)
    record = await run_in_threadpool(create_pipeline, session, principal.tenant, definition, settings.max_pipelines_per_tenant)
    await _announce(client, principal.tenant, definition)
    return record.public() | ({"warnings": warnings} if warnings else {})


@router.put("/{name}", openapi_extra=DEFINITION_BODY, responses=error_responses(400, 404, 409, 413, 422))
async def replace(
    name: TableName, request: Request, principal: AdminPrincipal, session: SessionDep, catalog: CatalogDep, client: RedisDep
) -> dict:
    definition = await _definition(request, principal.tenant)
    warnings = await run_in_threadpool(_check_tables, catalog, principal.tenant, definition)
    record = await run_in_threadpool(replace_pipeline, session, principal.tenant, name, definition)
    await _announce(client, principal.tenant, definition)
    return record.public() | ({"warnings": warnings} if warnings else {})


@router.get("")
def read_all(principal: ReadPrincipal, session: SessionDep) -> dict:
    return {"pipelines": [record.public() for record in list_pipelines(session, principal.tenant)]}


@router.get("/{name}", responses=error_responses(404, 422))
def read(name: TableName, principal: ReadPrincipal, session: SessionDep, version: int | None = Query(None, ge=0, le=2**31 - 1)) -> dict:
    return get_pipeline(session, principal.tenant, name, version).public()


@router.get("/{name}/versions", responses=error_responses(404, 422))
def read_versions(name: TableName, principal: ReadPrincipal, session: SessionDep) -> dict:
    return {"name": name, "versions": list_versions(session, principal.tenant, name)}


@router.get("/{name}/diff", responses=error_responses(404, 422))
def read_diff(
    name: TableName, principal: ReadPrincipal, session: SessionDep,
    from_: int = Query(..., alias="from", ge=0, le=2**31 - 1, description="the older version"),
    to: int | None = Query(None, ge=0, le=2**31 - 1, description="the newer version (default: the current one)"),
) -> dict:
    """What changed from one version to another: a unified diff of the two definitions as YAML
    (keys in their defined order; settings left at their defaults are not shown)."""
    older = get_pipeline(session, principal.tenant, name, from_)
    newer = get_pipeline(session, principal.tenant, name, to)
    lines = [
        yaml.safe_dump(record.public()["definition"], sort_keys=False, allow_unicode=True, width=120).splitlines()
        for record in (older, newer)
    ]
    diff = difflib.unified_diff(*lines, f"{name} version {older.version}", f"{name} version {newer.version}", lineterm="")
    return {"name": name, "from": older.version, "to": newer.version, "diff": "\n".join(diff)}


@router.delete("/{name}", responses=error_responses(404, 409, 422))
async def delete(name: TableName, principal: AdminPrincipal, session: SessionDep, client: RedisDep) -> dict:
    record = await run_in_threadpool(delete_pipeline, session, principal.tenant, name)
    await client.publish(PIPELINES_CHANNEL, principal.tenant.encode())
    return record.public() | {"deleted": True}


