"""The api's side of receipts: wait for a request's commit (wait=true), and follow pub/sub channels."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import orjson
import redis.asyncio as aioredis

from service.core.keys import COMMITTED_CHANNEL, receipt_key
from service.protocol.receipts import COMMITTED, FAILED, Receipt, parse_receipt

log = logging.getLogger(__name__)


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
    POLL_S; the channel makes the common case fast. The committer's announcement carries each
    settled receipt's fields (a JSON object of ids to fields); a waiter answers from them without
    reading the receipt again (a Redis round trip: ~10% of the api's CPU for 20-event requests).
    A list of ids (the writer's receipts settled without a table, failures, a committer of an
    earlier version) wakes its waiters to read their receipts.
    """

    POLL_S = 2.0

    def __init__(self, client: aioredis.Redis) -> None:
        self._client = client
        self._waiting: dict[str, set[asyncio.Event]] = {}
        self._settled: dict[str, dict[str, str]] = {}  # announced fields of receipts waited on here
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
        settled = orjson.loads(data)
        for receipt_id in settled:
            waiters = self._waiting.get(receipt_id)
            if waiters:
                if type(settled) is dict:
                    self._settled[receipt_id] = settled[receipt_id]
                for waiter in waiters:
                    waiter.set()

    async def _read(self, tenant: str, receipt_id: str) -> Receipt | None:
        fields = self._settled.get(receipt_id)
        if fields is not None:
            return parse_receipt(receipt_id, fields)
        return parse_receipt(receipt_id, await self._client.hgetall(receipt_key(tenant, receipt_id)))

    async def wait(self, tenant: str, receipt_id: str, timeout_s: float, fresh: bool = False) -> Receipt | None:
        """The receipt once committed (or failed), or its latest state when `timeout_s` passes.
        fresh: the receipt was just made (buffered): it is first read once announced (or after a poll)."""
        event = asyncio.Event()
        self._waiting.setdefault(receipt_id, set()).add(event)
        deadline = time.monotonic() + timeout_s
        receipt = None
        try:
            if fresh:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(event.wait(), timeout=min(self.POLL_S, timeout_s))
                event.clear()
            while True:
                try:
                    receipt = await self._read(tenant, receipt_id)
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
                    self._settled.pop(receipt_id, None)
