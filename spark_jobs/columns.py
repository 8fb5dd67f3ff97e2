"""The job's own columns beside an event's fields (all named with the internal prefix, which no
definition may use)."""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import Column
from pyspark.sql import functions as F

from spark_jobs.contract import INTERNAL_PREFIX

INTERNAL = f"{INTERNAL_PREFIX}_"
RECEIPT = "_calve_receipt"
EVENT = "_calve_event"
TABLE = "_calve_table"
REASON = "_calve_reason"
BODY = "_calve_body"
SIZE = "_calve_size"
OP = "_calve_op"  # row changes: I, U or D
OP_VALUE = "_calve_op_value"  # row changes: the operation expression's own value (for the DLQ reason)
SEQ = "_calve_seq"  # row changes: the event's place in the batch (request, then line)
DROPPED = "_calve_dropped"  # the event's top-level fields that no column of its table takes
NULLED = "_calve_nulled"  # the columns where the event's value could not be converted: NULL in the row
# An event's place: its request's index in the batch times LINE_SLOTS plus its line (a request
# holds at most max_events_per_request events, well below).
LINE_SLOTS = 1 << 24


def by_name(name: str) -> Column:
    """The column named `name` as it is: quoted, so that a dot in it (`http.method`) is not read as
    a path into a struct, nor a backtick as a quote."""
    return F.col("`" + name.replace("`", "``") + "`")


def column_name_ok(name: str) -> bool:
    """Whether a field of events may become a column of a table made or evolved from them: not a
    name with a dot (readers, Spark's among them, take `http.method` for a path into a struct) or
    a backtick (SQL's quote)."""
    return "." not in name and "`" not in name


def balanced(combine: Callable[[Column, Column], Column], columns: list[Column]) -> Column:
    """`columns` combined pairwise as a balanced tree: an expression as deep as log2 of their
    number. Spark Connect sends a plan as nested messages and pyspark walks them recursively, so a
    left-deep chain of one `|` per column fails a table of a few thousand columns (Python's
    recursion limit) while this stays 13 levels deep at 5,000."""
    if not columns:
        raise ValueError("nothing to combine")
    while len(columns) > 1:
        paired = [combine(a, b) for a, b in zip(columns[::2], columns[1::2])]
        columns = paired + ([columns[-1]] if len(columns) % 2 else [])
    return columns[0]


def all_of(flags: list[Column]) -> Column:
    return balanced(lambda a, b: a & b, flags) if flags else F.lit(True)


def any_of(flags: list[Column]) -> Column:
    return balanced(lambda a, b: a | b, flags) if flags else F.lit(False)
