"""The committer's side of receipts: mark them committed (or failed) and announce the ones that
settled."""

from __future__ import annotations

import time

import orjson
import redis

from service.core import metrics
from service.core.keys import (
    COMMITTED_CHANNEL,
    backlog_key,
    commit_stream_key,
    dead_commit_stream_key,
    receipt_key,
)
from service.protocol import commit_entry
from service.protocol.receipts import CHANGES_PREFIX
from service.protocol.scripts import MARK_COMMITTED, MARK_FAILED


class ReceiptPublisher:
    """The committer's side: mark receipts committed and announce the ones that completed."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._mark = client.register_script(MARK_COMMITTED)
        self._fail = client.register_script(MARK_FAILED)

    def mark_committed(
        self, tenant: str, table: str, snapshot_id: int, rows_by_receipt: dict[str, int],
        changes: dict[str, dict[str, int]] | None = None,
    ) -> list[str]:
        """`changes`: row changes' effects per receipt (inserted, updated, deleted, noop)."""
        now = f"{time.time():.3f}"
        ids = list(rows_by_receipt)
        if changes:
            pipe = self._client.pipeline(transaction=True)  # one tenant's keys: one slot, on a cluster too
            for receipt_id, counts in changes.items():
                if receipt_id in rows_by_receipt:
                    pipe.hset(receipt_key(tenant, receipt_id), f"{CHANGES_PREFIX}{table}", orjson.dumps(counts))
            pipe.execute()
        marked = self._mark(
            keys=[backlog_key(tenant), *(receipt_key(tenant, r) for r in ids)],
            args=[table, now, COMMITTED_CHANNEL, *(f"{snapshot_id}:{rows_by_receipt[r]}" for r in ids), *ids],
        ) if ids else []  # (it announces those it completed)
        completed = []
        for receipt_id, done in zip(ids, marked):
            if done:  # its created_at: the request's acceptance
                completed.append(receipt_id)
                if float(done) > 0:
                    metrics.ACCEPT_TO_COMMIT_SECONDS.labels(tenant).observe(max(0.0, float(now) - float(done)))
        return completed

    def dead_letter(self, tenant: str, table: str, entry_id: str, fields: dict[bytes, bytes], reason: str) -> list[str]:
        """Park a commit-stream entry that can never be committed on the table's dead commit stream
        with the reason, and fail its receipts; returns the receipts failed."""
        receipts = list(orjson.loads(fields[commit_entry.RECEIPTS.encode()]))
        now = f"{time.time():.3f}"
        # Its receipts failed first, then the entry parked: a crash in between leaves the entry to
        # be parked again, and failing a failed receipt does nothing.
        marked = self._fail(keys=[backlog_key(tenant), *(receipt_key(tenant, r) for r in receipts)], args=[reason, now]) if receipts else []
        failed = [receipt_id for receipt_id, done in zip(receipts, marked) if done]
        pipe = self._client.pipeline(transaction=True)
        parked = {**fields, commit_entry.DEAD_REASON.encode(): reason.encode(), commit_entry.DEAD_AT.encode(): now.encode(),
                  commit_entry.DEAD_ENTRY.encode(): entry_id.encode()}
        pipe.xadd(dead_commit_stream_key(tenant, table), parked)
        pipe.xdel(commit_stream_key(tenant, table), entry_id)
        pipe.execute()
        if failed:
            self._client.publish(COMMITTED_CHANNEL, orjson.dumps(failed))
        return failed
