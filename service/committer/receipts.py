"""The committer's side of receipts: mark them committed and announce the ones that completed."""

from __future__ import annotations

import time

import orjson
import redis

from service.core.keys import COMMITTED_CHANNEL, backlog_key, receipt_key
from service.protocol.scripts import MARK_COMMITTED


class ReceiptPublisher:
    """The committer's side: mark receipts committed and announce the ones that completed."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._mark = client.register_script(MARK_COMMITTED)

    def mark_committed(self, tenant: str, table: str, snapshot_id: int, rows_by_receipt: dict[str, int]) -> list[str]:
        now = f"{time.time():.3f}"
        pipe = self._client.pipeline(transaction=False)
        ids = list(rows_by_receipt)
        for receipt_id in ids:
            self._mark(
                keys=[receipt_key(tenant, receipt_id), backlog_key(tenant)],
                args=[table, f"{snapshot_id}:{rows_by_receipt[receipt_id]}", now],
                client=pipe,
            )
        completed = [receipt_id for receipt_id, done in zip(ids, pipe.execute()) if done]
        if completed:
            self._client.publish(COMMITTED_CHANNEL, orjson.dumps(completed))
        return completed
