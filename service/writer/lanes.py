"""One writer at a time per tenant for its heavy batches, so that one tenant's slow or failing
work never occupies every writer.

A batch is heavy when its pipeline's last job on this writer took HEAVY_JOB_S or more (wide
events, say), or when it failed before, or, in a round that holds other tenants' batches too,
when that job was the full Spark job (not all of it the short way) and took SLOW_JOB_S or more:
requests only the full job writes (events the api set aside as nested too deep: the job writes
their dead letters) cost it ~0.9 s a job under make chaos's poison_tenant (its job-duration
metric, the calm phases' short-way jobs taken out), against ~0.1-0.3 s for its neighbours' short-way jobs; run on both writers at
once, every round of both waited on them, and the neighbours' median latency went from 0.41 to
1.54 s. (A duration alone would not tell them apart: under that load a neighbour's short-way
job's mean went from 0.09 to 0.32 s, so a busy machine would lane well-behaved tenants.) Before
running one, a writer takes the tenant's lane (a Redis lease, renewed while the job runs); a
writer that finds it taken sets the batch aside (HeavyBatches) and serves other tenants
meanwhile. Light batches never wait for a lane, and a tenant alone on the writers keeps both for
its slow batches.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

import redis

from service.core import keys
from service.protocol import scripts
from service.protocol.stream_ids import text
from service.writer.batches import Batch, pending_of

HEAVY_JOB_S = 5.0  # a pipeline whose last job took this long has its next batches run in its tenant's lane
SLOW_JOB_S = 0.5  # ... and a full Spark job this long, while other tenants' batches are in the same round
LANE_LEASE_MS = 30_000  # renewed every third of it while the job runs; a crashed writer's lane frees itself


class Lanes:
    def __init__(self, client: redis.Redis, owner: str) -> None:
        self.client = client
        self.owner = owner
        self._renew = client.register_script(scripts.RENEW_LEASE)
        self._release = client.register_script(scripts.RELEASE_LEASE)
        # Per pipeline, its last job: (seconds, whether it was (in part) the full Spark job, or failed).
        self._last: dict[tuple[str, str], tuple[float, bool]] = {}

    def is_heavy(self, batch: Batch, crowded: bool = False) -> bool:
        """crowded: other tenants' batches wait in the same round."""
        seconds, full = self._last.get((batch.tenant, batch.pipeline), (0.0, False))
        return batch.failures > 0 or seconds >= HEAVY_JOB_S or (crowded and full and seconds >= SLOW_JOB_S)

    def expected_s(self, batch: Batch) -> float:
        return self._last.get((batch.tenant, batch.pipeline), (0.0, False))[0]

    def ran(self, batch: Batch, seconds: float, full: bool = False) -> None:
        """Its pipeline's last job took `seconds`; full: it was (in part) the full Spark job, or failed."""
        self._last[(batch.tenant, batch.pipeline)] = (seconds, full)

    @contextlib.contextmanager
    def lane(self, batch: Batch, crowded: bool = False) -> Iterator[bool]:
        """Whether `batch` may run now: light ones always; a heavy one while this writer holds its
        tenant's lane (kept, by a thread renewing it, until the block ends). crowded: as is_heavy."""
        if not self.is_heavy(batch, crowded):
            yield True
            return
        key = keys.heavy_lane_key(batch.tenant)
        if not self.client.set(key, self.owner, nx=True, px=LANE_LEASE_MS):
            held = self.client.get(key)
            if held is None or text(held) != self.owner:
                yield False
                return
        done = threading.Event()
        renewer = threading.Thread(target=self._keep, args=(key, done), name="heavy-lane", daemon=True)
        renewer.start()
        try:
            yield True
        finally:
            done.set()
            renewer.join()
            with contextlib.suppress(redis.RedisError):
                self._release(keys=[key], args=[self.owner])

    def _keep(self, key: str, done: threading.Event) -> None:
        while not done.wait(LANE_LEASE_MS / 3000):
            with contextlib.suppress(redis.RedisError):
                self._renew(keys=[key], args=[self.owner, LANE_LEASE_MS])


def keep_pending(client: redis.Redis, batch: Batch, owner: str) -> None:
    """Reset the idle time of a set-aside batch's entries that are still this writer's, so that
    no other writer reclaims them as a crashed writer's (JUSTID: not counted as a delivery)."""
    stream = keys.input_stream_key(batch.tenant, batch.pipeline)
    ours = pending_of(client, stream, batch.entries, owner)
    ids = [entry.id for entry in batch.entries if entry.id in ours]
    if ids:
        client.xclaim(stream, keys.WRITER_GROUP, owner, min_idle_time=0, message_ids=ids, justid=True)


@contextlib.contextmanager
def kept_pending(client: redis.Redis, owner: str, batches: Callable[[], list[Batch]], every_s: float) -> Iterator[None]:
    """While the block runs (a round of jobs, a heavy one ~20 s), keep the idle time of the
    entries this writer holds short (keep_pending every `every_s`): a live writer's entries are
    never reclaimed by another writer as a crashed one's, which would write them twice over."""
    done = threading.Event()

    def keep() -> None:
        while not done.wait(every_s):
            try:
                held = list(batches())
            except RuntimeError:  # changed while copied: the next turn sees it
                continue
            for batch in held:
                if batch.entries:
                    with contextlib.suppress(redis.RedisError):
                        keep_pending(client, batch, owner)

    keeper = threading.Thread(target=keep, name="pending-keeper", daemon=True)
    keeper.start()
    try:
        yield
    finally:
        done.set()
        keeper.join()
