"""Named fault points, for the fault tests: each does nothing unless CALVE_FAULT_POINTS names it.

A process whose fault point is switched on kills itself with SIGKILL exactly there, which is how
the tests hit windows a kill from outside cannot aim at (between a catalog commit and its
acknowledgement, say). Read once at start-up; never set it in production.
"""

from __future__ import annotations

import logging
import os
import signal

log = logging.getLogger(__name__)

ENV = "CALVE_FAULT_POINTS"
COMMITTER_BEFORE_CATALOG_COMMIT = "committer.before_catalog_commit"
COMMITTER_AFTER_CATALOG_COMMIT = "committer.after_catalog_commit"
WRITER_AFTER_SPARK_JOB = "writer.after_spark_job"

_ARMED = frozenset(name.strip() for name in os.environ.get(ENV, "").split(",") if name.strip())


def fault_point(name: str) -> None:
    if name in _ARMED:
        log.error("fault point %s is switched on: killing this process", name)
        os.kill(os.getpid(), signal.SIGKILL)
