"""Work a table's leader hands to the writers on a Redis list: one request at a time, between
batches (compaction.py, changes.py, diffs.py).

Each helper says how to run a request (`run`: the Spark job and what it wrote), how to hand its
outcome over (`finish`), and what a failure means (`failed`); the try, the clean-up of what a
failed run wrote, and the outage policy are here once. `finish` is outside the try: a Redis
error while answering must not delete files the answer may already name (as before the
helpers shared this base). A Spark outage is no fault of the request, which goes back on the
queue while the writer waits (waking at once when it is told to stop).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

import redis
from pyiceberg.catalog import Catalog

from service.iceberg.files import catalog_io, delete_files, list_data_files
from spark_jobs.spark_errors import is_spark_outage

log = logging.getLogger(__name__)

OUTAGE_BACKOFF_S = 2.0


@dataclass
class Scratch:
    """Where a request's job writes, deleted when the request fails."""

    directory: str | None = None


class LeaderRequests:
    """Pops the requests of one list (`queue`) and runs each (`run`); `failed` answers a failure."""

    queue: str
    waits_out_outages = True  # a Spark outage puts the request back on the queue (else: failed)

    def __init__(self, client: redis.Redis, catalog: Catalog, spark_remote: str, name: str, tasks: int | None = None) -> None:
        self.client = client
        self.catalog = catalog
        self.spark_remote = spark_remote
        self.name = name
        self.io = catalog_io(catalog)
        # The Spark tasks a request's job runs at once (Settings.compact_tasks; None: unbounded):
        # a leader's work shares the cores with every writer's ingest.
        self.tasks = tasks

    def waiting(self) -> bool:
        """Whether a request waits on the queue."""
        return bool(self.client.exists(self.queue))

    def run_one(self, stop: threading.Event) -> bool:
        """Run one waiting request; False when none waits."""
        raw = self.client.lpop(self.queue)
        if raw is None:
            return False
        request = self.decode(raw)
        scratch = Scratch()
        try:
            outcome = self.run(request, scratch)
        except Exception as exc:  # noqa: BLE001 - each helper's `failed` says what a failure means
            if scratch.directory is not None:
                delete_files(list_data_files(scratch.directory, self.io), self.io)
            if self.waits_out_outages and is_spark_outage(exc):
                log.warning("writer: Spark is unavailable (%s); %s waits for it", exc, self.describe(request))
                self.client.rpush(self.queue, raw)
                stop.wait(OUTAGE_BACKOFF_S)
                return True
            self.failed(request, exc)
            return True
        self.finish(request, outcome)
        return True

    def decode(self, raw: bytes) -> Any:
        raise NotImplementedError

    def describe(self, request: Any) -> str:
        raise NotImplementedError

    def run(self, request: Any, scratch: Scratch) -> None:
        raise NotImplementedError

    def finish(self, request: Any, outcome: Any) -> None:
        """Answer a request whose run succeeded with `outcome`: by default there is nobody to answer."""

    def failed(self, request: Any, exc: Exception) -> None:
        raise NotImplementedError


def error_text(exc: Exception) -> str:
    return f"{exc.__class__.__name__}: {exc}"[:1000]
