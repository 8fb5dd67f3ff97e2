"""Receipts: what happened to one ingest request.

A receipt is a Redis hash, created with the input entry. The writer records which tables got
rows; the committer records each table's snapshot and, when every table of the receipt is
committed, flips the status and announces it on a pub/sub channel that waiting requests follow.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson
import redis
import redis.asyncio as aioredis

from service.core.keys import COMMITTED_CHANNEL, DLQ_TABLE, backlog_key, receipt_key

log = logging.getLogger(__name__)

BUFFERED = "buffered"
WRITTEN = "written"
COMMITTED = "committed"
FAILED = "failed"

WRITTEN_PREFIX = "written:"
COMMITTED_PREFIX = "committed:"

# Marks one table of a receipt committed; when all its tables are, marks the receipt committed and
# takes its events off the tenant's backlog (KEYS[2]). Returns 1 only for the call that completed
# the receipt, so it is announced, and the backlog lowered, once.
_MARK_COMMITTED = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'committed:' .. ARGV[1], ARGV[2])
if redis.call('HGET', KEYS[1], 'status') == 'committed' then return 0 end
local expected = tonumber(redis.call('HGET', KEYS[1], 'tables') or '0')
local done = 0
for _, name in ipairs(redis.call('HKEYS', KEYS[1])) do
  if string.sub(name, 1, 10) == 'committed:' then done = done + 1 end
end
if done >= expected then
  redis.call('HSET', KEYS[1], 'status', 'committed', 'committed_at', ARGV[3])
  redis.call('DECRBY', KEYS[2], tonumber(redis.call('HGET', KEYS[1], 'events') or '0'))
  return 1
end
return 0
"""


@dataclass
class Receipt:
    id: str
    status: str
    events: int
    pipeline: str
    created_at: float
    tables: dict[str, dict] = field(default_factory=dict)
    error: str | None = None
    written_at: float | None = None
    committed_at: float | None = None

    def public(self) -> dict:
        body = {
            "receipt": self.id,
            "status": self.status,
            "events": self.events,
            "pipeline": self.pipeline,
            "created_at": self.created_at,
            "written_at": self.written_at,
            "committed_at": self.committed_at,
            "tables": self.tables,
            # Events of the request that went to the tenant's DLQ table instead (with their reasons).
            "dlq_events": self.tables.get(DLQ_TABLE, {}).get("rows", 0),
        }
        if self.error:
            body["error"] = self.error
        return body


def parse_receipt(receipt_id: str, raw: dict[bytes | str, bytes | str]) -> Receipt | None:
    if not raw:
        return None
    fields = {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v) for k, v in raw.items()}
    tables: dict[str, dict] = {}
    for name, value in fields.items():
        if name.startswith(WRITTEN_PREFIX):
            tables.setdefault(name[len(WRITTEN_PREFIX):], {})["rows"] = int(value)
        elif name.startswith(COMMITTED_PREFIX):
            snapshot_id, _, rows = value.partition(":")
            entry = tables.setdefault(name[len(COMMITTED_PREFIX):], {})
            entry["snapshot_id"] = int(snapshot_id)
            entry["rows"] = int(rows)
    return Receipt(
        id=receipt_id,
        status=fields.get("status", BUFFERED),
        events=int(fields.get("events", 0)),
        pipeline=fields.get("pipeline", ""),
        created_at=float(fields.get("created_at", 0)),
        tables=tables,
        error=fields.get("error"),
        written_at=float(fields["written_at"]) if "written_at" in fields else None,
        committed_at=float(fields["committed_at"]) if "committed_at" in fields else None,
    )


def get_receipt(client: redis.Redis, tenant: str, receipt_id: str) -> Receipt | None:
    return parse_receipt(receipt_id, client.hgetall(receipt_key(tenant, receipt_id)))


class ReceiptPublisher:
    """The committer's side: mark receipts committed and announce the ones that completed."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._mark = client.register_script(_MARK_COMMITTED)

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


async def follow_channel(
    client: aioredis.Redis, channel: str, on_message: Callable[[bytes], None], on_subscribed: Callable[[], None] | None = None
) -> None:
    """Call `on_message` for each message on a pub/sub channel, forever, resubscribing when Redis
    goes away; `on_subscribed` runs after each (re)subscription, for what was missed meanwhile."""
    while True:
        try:
            pubsub = client.pubsub()
            await pubsub.subscribe(channel)
            if on_subscribed is not None:
                on_subscribed()
            async for message in pubsub.listen():
                if message.get("type") == "message":
                    on_message(message["data"])
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - Redis went away: wait, then subscribe again
            log.warning("subscription to %s lost (%s); resubscribing", channel, exc)
            await asyncio.sleep(1.0)


class ReceiptWaiter:
    """The api's side: one pub/sub subscription per process, fanned out to waiting requests.

    Pub/sub loses messages across reconnects, so each waiter also re-reads its receipt every
    POLL_S; the channel makes the common case fast.
    """

    POLL_S = 2.0

    def __init__(self, client: aioredis.Redis) -> None:
        self._client = client
        self._waiting: dict[str, set[asyncio.Event]] = {}
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._listen(), name="receipt-waiter")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _listen(self) -> None:
        # While unsubscribed, waiters keep polling their receipts, so nothing is missed for long.
        await follow_channel(self._client, COMMITTED_CHANNEL, self._wake)

    def _wake(self, data: bytes) -> None:
        for receipt_id in orjson.loads(data):
            for waiter in self._waiting.get(receipt_id, ()):
                waiter.set()

    async def wait(self, tenant: str, receipt_id: str, timeout_s: float) -> Receipt | None:
        """The receipt once committed or failed, or its latest state when `timeout_s` passes."""
        event = asyncio.Event()
        self._waiting.setdefault(receipt_id, set()).add(event)
        deadline = time.monotonic() + timeout_s
        receipt = None
        try:
            while True:
                try:
                    receipt = parse_receipt(receipt_id, await self._client.hgetall(receipt_key(tenant, receipt_id)))
                except aioredis.RedisError as exc:
                    # The request is already durable: a Redis outage now must not turn its answer
                    # into an error, or the producer would send it again. Keep waiting; at the
                    # deadline the caller answers with what was last known (accepted).
                    log.warning("receipt %s: Redis unavailable while waiting (%s)", receipt_id, exc)
                else:
                    if receipt is None or receipt.status in (COMMITTED, FAILED):
                        return receipt
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return receipt
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(event.wait(), timeout=min(self.POLL_S, remaining))
                event.clear()
        finally:
            waiters = self._waiting.get(receipt_id)
            if waiters is not None:
                waiters.discard(event)
                if not waiters:
                    del self._waiting[receipt_id]
