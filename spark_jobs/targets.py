"""What a job writes to and what it reports back: a table as the job sees it (Target), and what
it wrote for each table (Output, JobResult)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql import DataFrame

from spark_jobs.contract import new_directory  # noqa: F401 - where the writer finds it
from spark_jobs.definition import Sink

MAX_DROPPED_NAMES = 20  # per table and request: the names a receipt lists of the fields dropped


@dataclass(frozen=True)
class Target:
    """A table as the job needs it: where to write, its schema, which columns are required."""

    name: str
    schema: pa.Schema  # the Iceberg schema as Arrow
    required: frozenset[str]
    partition: list[tuple[str, str]]  # (source column, transform)
    directory: str
    target_file_size: int | None = None  # bytes; approximate (see rows_per_file)
    changes: ChangeSpec | None = None  # row changes by key instead of appends
    extra_fields: str | None = None  # the map<string, string> column keeping fields no column takes
    filesystem: object | None = None  # a pyarrow FileSystem for `directory` Spark cannot reach itself (spark_jobs/files.py)


@dataclass(frozen=True)
class ChangeSpec:
    """How a sink's events change rows: the operation expression (None: every event inserts), the
    identifier columns, and upsert (an update of a missing key inserts it)."""

    operation: str | None
    keys: tuple[str, ...]
    upsert: bool


@dataclass
class Output:
    """What the job wrote for one table (or the DLQ)."""

    directory: str
    rows_by_receipt: dict[str, int] = field(default_factory=dict)
    changes: ChangeSpec | None = None  # row changes to apply (not data files)
    # receipt -> (up to MAX_DROPPED_NAMES names of fields no column took, events that had any)
    dropped_by_receipt: dict[str, tuple[list[str], int]] = field(default_factory=dict)
    # receipt -> (up to MAX_DROPPED_NAMES names of columns whose values could not be converted, so
    # NULL in their rows; events that had any)
    nulled_by_receipt: dict[str, tuple[list[str], int]] = field(default_factory=dict)
    # Where else this batch's files of the table are: the short way's, for the requests it took
    # when the Spark job took the others
    more_directories: list[str] = field(default_factory=list)

    @property
    def directories(self) -> list[str]:
        return [self.directory, *self.more_directories]

    def add(self, directory: str, rows_by_receipt: dict[str, int] | None = None,
            nulled_by_receipt: dict[str, tuple[list[str], int]] | None = None,
            dropped_by_receipt: dict[str, tuple[list[str], int]] | None = None) -> None:
        """More of this batch's files of the table (another sink's, or the other way's) and their
        rows per receipt; each request's NULLed columns and dropped fields are one way's, so
        taken as they are."""
        if directory not in self.directories:
            self.more_directories.append(directory)
        for receipt, rows in (rows_by_receipt or {}).items():
            self.rows_by_receipt[receipt] = self.rows_by_receipt.get(receipt, 0) + rows
        self.nulled_by_receipt.update(nulled_by_receipt or {})
        self.dropped_by_receipt.update(dropped_by_receipt or {})


@dataclass
class JobResult:
    tables: dict[str, Output] = field(default_factory=dict)
    dlq: Output | None = None
    # spark_jobs/direct_append.py: "written" (it wrote the batch), "partial" (it wrote some
    # requests, the Spark job the rest: `rejected`), "refused" (a value needs the Spark job, which
    # wrote it), "failed" (it could not run: the Spark job wrote it), None (the batch could not take it)
    direct: str | None = None
    rejected: list[int] = field(default_factory=list)  # "partial": the places of the requests the Spark job takes
    filesystem: object | None = None  # "partial": the short way's Target.filesystem (to delete its files should the rest fail)
    # Where the short way's tasks got the bodies: "redis" (they read them: stream_bodies.py) or
    # "shipped" (with the job); None when it did not run
    bodies: str | None = None


# resolve(table name, the sink's definition, the rows bound for it: None for none to create or
# evolve the table from) -> Target, a reason to send those rows to the DLQ, or None when there are
# none (or, for None, the table is to be created from its rows)
Resolver = Callable[[str, Sink, "DataFrame | None"], "Target | str | None"]

