"""One way to meet a commit conflict: reload the table and plan again.

Every commit is compare-and-swap on the table's metadata (pyiceberg's own retry is off: it would
re-apply an append without Calve's watermark check). When another writer or leader changed the
table first, the attempt is made again on the reloaded table, where it plans anew: a schema
change finds the fields already there, an append keeps only the entries past the new watermark.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_none
from tenacity.wait import wait_base

T = TypeVar("T")


def retry_on_conflict(
    catalog: Catalog, table: Table, attempt: Callable[[Table], T], *, attempts: int, wait: wait_base | None = None,
    on_conflict: Callable[[], None] | None = None,
) -> T:
    """`attempt(table)`, made again on the reloaded table after each conflict (`on_conflict` is
    told of each, for a metric), at most `attempts` times with `wait` between; the last conflict
    is raised."""
    current = table
    retrying = Retrying(retry=retry_if_exception_type(CommitFailedException), stop=stop_after_attempt(attempts),
                        wait=wait or wait_none(), reraise=True)
    for try_ in retrying:
        with try_:
            try:
                return attempt(current)
            except CommitFailedException:
                if on_conflict is not None:
                    on_conflict()
                current = catalog.load_table(current.name())
                raise
    raise AssertionError("unreachable: tenacity returns or raises")  # pragma: no cover
