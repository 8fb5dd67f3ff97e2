"""Calve's exceptions."""


class CalveError(Exception):
    """Base of every error Calve raises on purpose."""


class BadRequestBody(CalveError):
    """The request body is not JSON, JSON lines or a JSON object/array Calve accepts."""


class BodyTooLarge(CalveError):
    """The request body exceeds a size or count limit."""


class LeadershipLost(CalveError):
    """This committer no longer holds the lease of the table it was committing."""


class StartupError(CalveError):
    """A part of the embedded stack could not be started; the message says what to do."""


class InvalidName(CalveError):
    """A tenant, table, pipeline or path name that may not reach the catalog, files or Redis."""


class AlreadyExists(CalveError):
    """A tenant (or other named thing) with that name exists already."""


class NotFound(CalveError):
    """No such thing for this tenant (also what another tenant's things look like)."""


class ChangesNotApplied(Exception):
    """Row changes whose application no longer fits the table (it moved since): apply them again."""


class ChangesFailed(Exception):
    """A writer could not apply a table's row changes (the reason is the message)."""
