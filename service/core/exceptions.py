"""Every exception Calve raises on purpose, under one base (CalveError).

Those a caller may also know by a built-in kind keep it as a second base (a definition error is a
ValueError too), so `except ValueError` around parsing still catches them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFileContent
    from pyiceberg.table.snapshots import Snapshot


class CalveError(Exception):
    """Base of every error Calve raises on purpose."""


# -- requests -------------------------------------------------------------------------------


class BadRequestBody(CalveError):
    """The request body is not JSON, JSON lines or a JSON object/array Calve accepts."""


class BodyTooLarge(CalveError):
    """The request body exceeds a size or count limit."""


class OtlpError(CalveError, ValueError):
    """The body is not an OTLP logs export request; the message says what is wrong."""


class LokiError(CalveError, ValueError):
    """The body is not a Loki push request; the message says what is wrong."""


# -- names and things -----------------------------------------------------------------------


class InvalidName(CalveError):
    """A tenant, table, pipeline or path name that may not reach the catalog, files or Redis."""


class AlreadyExists(CalveError):
    """A tenant (or other named thing) with that name exists already."""


class NotFound(CalveError):
    """No such thing for this tenant (also what another tenant's things look like)."""


class StartupError(CalveError):
    """A part of the embedded stack could not be started; the message says what to do."""


# -- pipeline definitions -------------------------------------------------------------------


class SpecError(CalveError, ValueError):
    """A field of a definition is wrong; `field` names it (sinks[0].table), the message says why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class DefinitionInvalid(CalveError, ValueError):
    """One or more fields of a pipeline definition are wrong."""

    def __init__(self, errors: list[SpecError]) -> None:
        super().__init__("; ".join(str(error) for error in errors))
        self.errors = errors

    def detail(self) -> list[dict[str, str]]:
        return [{"field": error.field, "error": error.message} for error in self.errors]


# -- commits --------------------------------------------------------------------------------


class LeadershipLost(CalveError):
    """This committer no longer holds the lease of the table it was committing."""


class FilesNotLive(CalveError):
    """A rewrite replaces files the table no longer holds (another rewrite or change replaced
    them since it was planned): committing it would bring back rows."""


class RowsChanged(CalveError):
    """A replace whose new files do not hold as many rows as the files they replace."""


class ChangesNotApplied(CalveError):
    """Row changes whose application no longer fits the table (it moved since): apply them again."""


class ChangesFailed(CalveError):
    """A writer could not apply a table's row changes (the reason is the message)."""


# -- the change feed ------------------------------------------------------------------------


class BadCursor(CalveError, ValueError):
    """A change-feed cursor that is not one Calve gave out."""


class ChangelogError(CalveError):
    """The changes asked for cannot be read; the message says why and what to do."""


class SnapshotMissing(ChangelogError):
    """The snapshot named is not (or no longer) one of the table's."""

    def __init__(self, table: str, snapshot_id: int) -> None:
        super().__init__(f"table {table!r} has no snapshot {snapshot_id}: it was expired, or never was one of this table's")
        self.snapshot_id = snapshot_id


class SnapshotUnknown(SnapshotMissing):
    """The snapshot named never was one of the table's: its id is not one Iceberg gives, or the
    table's history is whole (nothing of it was expired) and does not hold it."""

    def __init__(self, table: str, snapshot_id: int) -> None:
        ChangelogError.__init__(self, f"table {table!r} never had a snapshot {snapshot_id}; GET /v1/tables/{table.rsplit('.', 1)[-1]} "
                                      "lists its snapshots")
        self.snapshot_id = snapshot_id


class NotAnAncestor(ChangelogError):
    """The range's first snapshot is not on the history of its last."""

    def __init__(self, table: str, from_id: int, to_id: int) -> None:
        super().__init__(f"snapshot {from_id} is not an ancestor of snapshot {to_id} in table {table!r}: the table's history does not pass through it")


class HistoryExpired(ChangelogError):
    """The history before the oldest kept snapshot is gone."""

    def __init__(self, table: str, oldest: Snapshot) -> None:
        super().__init__(
            f"the history of table {table!r} before snapshot {oldest.snapshot_id} was expired: read the changes "
            f"from_snapshot={oldest.snapshot_id}, or start a consumer with an initial load"
        )


class DeleteFilesFound(ChangelogError):
    """The snapshot has equality delete files, which the change feed does not read."""

    def __init__(self, table: str, content: DataFileContent) -> None:
        kind = "equality" if content.name == "EQUALITY_DELETES" else "position"
        super().__init__(
            f"table {table!r} has {kind} delete files (written by another engine: Flink, or Spark in merge-on-read "
            "mode with equality deletes); the change feed reads data files and position deletes only, since the rows "
            "an equality delete removes cannot be told without reading the whole table: rewrite the data files with "
            "the deletes applied (for example Spark's rewrite_data_files with delete-file-threshold=1), then read the "
            "changes from the snapshot after that"
        )


class ReservedColumn(ChangelogError):
    """The table has a column named as one the change feed adds."""

    def __init__(self, table: str, column: str) -> None:
        super().__init__(f"table {table!r} has a column {column!r}, a name the change feed adds to each row: rename the column")


class CursorBehind(ChangelogError):
    """An ack of a cursor before the consumer's checkpoint."""


class ConsumerLagging(ChangelogError):
    """The snapshots a consumer had read to are gone: it must start again."""
