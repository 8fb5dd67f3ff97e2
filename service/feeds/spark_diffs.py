"""Large snapshots' changes computed on Spark by a writer, for a feed reader (api or committer):
it asks once per snapshot and schema, waits for the answer, and reads the Parquet files the
writer left; on an error or a timeout it computes them itself (service/protocol/feeds.py)."""

from __future__ import annotations

import logging
import time
import uuid

import redis

from service.core import keys
from service.iceberg.catalog import calve_table_name
from service.iceberg.changelog import Changelog, SnapshotChanges, SnapshotFiles
from service.protocol import feeds
from service.protocol.feeds import DiffRequest, DiffResult

log = logging.getLogger(__name__)
POLL_S = 0.2


class SparkDiffs:
    def __init__(self, client: redis.Redis, min_rows: int, timeout_s: float) -> None:
        self.client = client
        self.min_rows = min_rows
        self.timeout_s = timeout_s

    def __call__(self, changelog: Changelog, files: SnapshotFiles) -> SnapshotChanges | None:
        """The snapshot's changes from Spark, or None: small enough to compute here, or Spark failed."""
        rows = sum(part.file.record_count for part in (*files.removed, *files.added))
        if files.rearranges_only or not files.removed or not files.added or rows < self.min_rows or not files.whole_files:
            return None  # position deletes to apply (merge-on-read): diff_job reads whole files only
        tenant, table = changelog.table.name()[-2:]
        table = calve_table_name(changelog.table.catalog, table)
        snapshot_id, schema_id = files.snapshot.snapshot_id, changelog.schema.schema_id
        key = keys.feed_diff_key(tenant, table, snapshot_id, schema_id)
        request = DiffRequest(tenant, table, snapshot_id, schema_id, uuid.uuid4().hex)
        if self.client.hsetnx(key, feeds.REQUEST, request.to_json()):  # nobody asked yet
            self.client.expire(key, int(self.timeout_s))  # a request lost with its writer (or before it) is asked again after this
            self.client.rpush(keys.FEED_DIFFS, request.to_json())
            log.info("feed: asked a writer for the changes of snapshot %s of %s.%s (%d rows)", snapshot_id, tenant, table, rows)
        deadline = time.monotonic() + self.timeout_s
        while (raw := self.client.hget(key, feeds.RESULT)) is None:
            if time.monotonic() > deadline:
                log.warning("feed: no writer answered for snapshot %s of %s.%s in %.0f s; computing here", snapshot_id, tenant, table, self.timeout_s)
                return None
            time.sleep(POLL_S)
        result = DiffResult.from_json(raw)
        if result.error:
            log.warning("feed: Spark could not diff snapshot %s of %s.%s (%s); computing here", snapshot_id, tenant, table, result.error)
            return None
        return SnapshotChanges(files, spilled=result.files, spilled_rows=result.rows)
