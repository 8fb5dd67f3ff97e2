"""Per-table leadership: a Redis lease plus a fencing counter.

The lease (SET NX PX) says who may commit a table now. Each new lease takes the next value of the
table's fencing counter, and the committer writes that value into every snapshot summary, so a
commit made by a leader that had lost its lease (paused past it, say) is visible afterwards. The
catalog's compare-and-swap and the watermark make such a commit harmless; the fence makes it
detectable.
"""

from __future__ import annotations

import time

import redis

from service.core import keys
from service.protocol import scripts

RENEW_SHARE = 5  # a held lease is renewed once this share of it has passed (every 2 s of the default 10 s), not at every tick


class TableLease:
    def __init__(self, client: redis.Redis, tenant: str, table: str, owner: str, lease_ms: int) -> None:
        self.client = client
        self.tenant = tenant
        self.table = table
        self.owner = owner
        self.lease_ms = lease_ms
        self.key = keys.lease_key(tenant, table)
        self.fence: int | None = None
        self.renewed_at = float("-inf")  # (monotonic) when its last take or renewal was sent
        self._renew = client.register_script(scripts.RENEW_LEASE)
        self._release = client.register_script(scripts.RELEASE_LEASE)

    def acquire(self) -> bool:
        """Take the lease if nobody holds it; a successful take gets a new fence value."""
        self.renewed_at = time.monotonic()  # (before it is sent: its expiry runs from Redis's receipt of it)
        if not self.client.set(self.key, self.owner, nx=True, px=self.lease_ms):
            return False
        self.fence = int(self.client.incr(keys.fence_key(self.tenant, self.table)))
        return True

    def renew(self) -> bool:
        """Extend the lease; False when it expired and someone else may hold it now."""
        if self.fence is None:
            return False
        sent = time.monotonic()
        if self._renew(keys=[self.key], args=[self.owner, self.lease_ms]):
            self.renewed_at = sent
            return True
        self.fence = None
        return False

    def renewed_lately(self, now: float) -> bool:
        """Whether it was taken or renewed less than a RENEW_SHARE-th of its length ago: it is
        still this committer's unless Redis lost it (a commit asks Redis first: held)."""
        return self.fence is not None and now - self.renewed_at < self.lease_ms / 1000 / RENEW_SHARE

    def held(self) -> bool:
        if self.fence is None:
            return False
        owner = self.client.get(self.key)
        return owner is not None and owner.decode() == self.owner

    def release(self) -> None:
        if self.fence is not None:
            self._release(keys=[self.key], args=[self.owner])
            self.fence = None
