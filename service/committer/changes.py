"""Row-change commits: the leader asks a writer to apply a run of changes entries against the
table as it is now (service/writer/changes.py), then commits the answer as one overwrite, only
if the table is still at the snapshot the answer was computed against; otherwise it asks again."""

from __future__ import annotations

import logging
import time
import uuid
from typing import TYPE_CHECKING

import redis
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from service.committer.leases import TableLease
from service.committer.state import ChangeFailures, CommitPlan
from service.core import keys, metrics
from service.core.config import Settings
from service.core.exceptions import ChangesFailed, ChangesNotApplied, FilesNotLive
from service.iceberg.files import catalog_io, delete_files
from service.iceberg.watermark import appended_ahead_since
from service.protocol import changes
from service.protocol.changes import ApplyRequest, ApplyResult
from service.protocol.stream_ids import id_after

if TYPE_CHECKING:
    from service.committer.commits import TableCommits

log = logging.getLogger(__name__)


class ChangeCommits:
    def __init__(self, settings: Settings, client: redis.Redis, catalog: Catalog, commits: TableCommits) -> None:
        self.settings = settings
        self.client = client
        self.catalog = catalog
        self.commits = commits
        self.failures = ChangeFailures(settings.commit_max_failures)
        self.asked_at: dict[str, float] = {}  # when each table's run now being applied was asked for (monotonic)
        self.committed: dict[str, tuple[float, str]] = {}  # a run committed, by table: when it was asked for, its last entry

    def commit(self, tenant: str, table_name: str, table: Table, segment: CommitPlan, lease: TableLease) -> bool | None:
        """Row changes: ask a writer to apply them against the table as it is now, then commit its
        answer as one overwrite if the table is still there. None while the answer is awaited."""
        key = keys.applying_key(tenant, table_name)
        member = keys.member(tenant, table_name)
        if self.failures.applies_alone(member, segment.entries[0].entry_id):
            segment = CommitPlan(segment.entries[:1])  # it failed with the others: on its own now
        state = self.client.hgetall(key)
        current = table.metadata.current_snapshot_id
        request = ApplyRequest.from_json(state[changes.REQUEST.encode()]) if changes.REQUEST.encode() in state else None
        if request is None or request.entries[0][0] != segment.entries[0].entry_id:
            self._ask(tenant, table_name, segment, current)
            return None
        raw = state.get(changes.RESULT.encode())
        if raw is None:
            return None
        result = ApplyResult.from_json(raw)
        if result.request != request.request:
            return None
        if result.error:
            self.client.delete(key)
            self.asked_at.pop(member, None)  # no longer awaited: asked again once the table's failed commit is waited out
            if len(request.entries) == 1 and self.failures.applies_alone(member, request.entries[0][0]):
                self.failures.record_settled(member)
                self.commits.park(tenant, table_name, segment.entries[0], f"row changes failed to apply on their own: {result.error}")
                return False
            self.failures.record_failure(member, segment.entries[0].entry_id)
            raise ChangesFailed(result.error)
        covered = CommitPlan([e for e in segment.entries if not id_after(e.entry_id, request.last_entry)], applied=result)
        try:
            if result.base_snapshot != current and not appended_ahead_since(table, result.base_snapshot):
                raise ChangesNotApplied(f"snapshot {current} is not {result.base_snapshot}, which they were applied to")
            committed = self.commits.apply(tenant, table_name, table, covered, lease)
        except (ChangesNotApplied, FilesNotLive) as exc:
            metrics.CHANGES_REAPPLIED.labels(tenant, table_name).inc()
            log.info("committer: %s.%s moved while its changes were applied (%s); applying them again", tenant, table_name, exc)
            committed = False
        self.client.delete(key)
        if not committed:  # the table moved since the request (or a rival leader committed them)
            delete_files(result.written, catalog_io(self.catalog))
            return False
        delete_files(covered.files, catalog_io(self.catalog))  # the change files: applied and committed
        self.failures.record_settled(member)
        self.committed[member] = (self.asked_at.pop(member, time.monotonic()), request.last_entry)
        return True

    def answered(self, tenant: str, table_name: str) -> bool:
        """Whether the table's run asked for has its answer, or its request is gone (expired
        unanswered: asked again). Until then, nothing of the table is loaded or committed."""
        request, result = self.client.hmget(keys.applying_key(tenant, table_name), [changes.REQUEST, changes.RESULT])
        return request is None or result is not None

    def committed_run(self, member: str) -> float | None:
        """When the table's run committed since the last call was asked for (None: none was)."""
        asked, _last = self.committed.pop(member, (None, None))
        return asked

    def covered(self, member: str, segment: CommitPlan) -> bool:
        """Whether the run just committed covered every entry of `segment` (entries queued after
        it was asked for wait for the next)."""
        return member in self.committed and self.committed[member][1] == segment.watermark

    def _ask(self, tenant: str, table_name: str, segment: CommitPlan, current: int | None) -> None:
        first = segment.entries[0]
        # Appends committed ahead of these changes came after them: the run does not see their files.
        request = ApplyRequest(tenant, table_name, uuid.uuid4().hex, current,
                               [(entry.entry_id, entry.files) for entry in segment.entries], first.keys, first.upsert,
                               unseen=self.commits.ahead_files.get(keys.member(tenant, table_name), []))
        key = keys.applying_key(tenant, table_name)
        self.asked_at[keys.member(tenant, table_name)] = time.monotonic()
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(key)
        pipe.hset(key, changes.REQUEST, request.to_json())
        pipe.expire(key, int(self.settings.apply_timeout_s))
        pipe.execute()
        # Queued after: a crash in between leaves a request no writer saw, asked again after
        # apply_timeout_s, as a request lost with its writer is.
        self.client.rpush(keys.APPLIES, request.to_json())
