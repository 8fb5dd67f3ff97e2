"""The job's own columns beside an event's fields (all named with the internal prefix, which no
definition may use)."""

from __future__ import annotations

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
# An event's place: its request's index in the batch times LINE_SLOTS plus its line (a request
# holds at most max_events_per_request events, well below).
LINE_SLOTS = 1 << 24
