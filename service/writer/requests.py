"""Work a table's leader hands to the writers on a Redis list: one request at a time, between
batches (compaction.py, changes.py)."""

from __future__ import annotations

import redis
from pyiceberg.catalog import Catalog


class LeaderRequests:
    """Pops the requests of one list (`queue`) and runs each (`run`)."""

    queue: str

    def __init__(self, client: redis.Redis, catalog: Catalog, spark_remote: str, name: str) -> None:
        self.client = client
        self.catalog = catalog
        self.spark_remote = spark_remote
        self.name = name

    def run_one(self) -> bool:
        """Run one waiting request; False when none waits."""
        raw = self.client.lpop(self.queue)
        if raw is None:
            return False
        self.run(raw)
        return True

    def run(self, raw: bytes) -> None:
        raise NotImplementedError
