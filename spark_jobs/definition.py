"""What a job needs of a pipeline definition (service/pipelines/spec.py's models satisfy it):
spark_jobs imports nothing of service, so the shape is declared here and checked by type."""

from __future__ import annotations

from typing import Protocol


class Processor(Protocol):
    """One step over the events: exactly one of the four is set."""

    where: str | None
    set: dict[str, str] | None
    drop: list[str] | None
    rename: dict[str, str] | None


class Sink(Protocol):
    """Where a pipeline's events go."""

    table: str  # a name, or a template of one (`${service}_events`)
    routes: list[str]
    operation: str | None
    identifier_columns: list[str] | None
    target_file_size: int | None
    extra_fields: str | None

    @property
    def dynamic(self) -> bool: ...

    @property
    def table_fields(self) -> list[str]: ...

    @property
    def row_changes(self) -> bool: ...


class Definition(Protocol):
    processors: list[Processor]
    routes: dict[str, str]
    sinks: list[Sink]
