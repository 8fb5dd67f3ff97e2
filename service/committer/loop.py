"""The committer's loop: one leader per table turns written files into Iceberg snapshots.

Each tick, for every table this committer leads (or can lead: committer/leases.py): the upkeep
asked for by hand, scheduled upkeep, feeding the pipelines that read the table's changes, and,
when its commit interval is up, its commit (committer/commits.py). One table's failure is
counted and retried; it never stops the others. On shutdown, what is pending is committed.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

import redis
from pyiceberg.catalog import Catalog
from sqlalchemy.exc import OperationalError

from service.committer.commits import TRANSIENT, TableCommits
from service.committer.feeds import FeedPump
from service.committer.leases import TableLease
from service.committer.receipts import ReceiptPublisher
from service.committer.state import CommitSchedule, UpkeepSchedule
from service.committer.upkeep import TableUpkeep
from service.core import keys, metrics
from service.core.config import Settings
from service.core.db import sqlite_write_lock_holders
from service.core.exceptions import LeadershipLost
from service.core.identity import consumer_name
from service.iceberg.catalog import table_identifier
from service.protocol import changes
from service.protocol.heartbeats import Heartbeats
from service.protocol.stream_ids import text

log = logging.getLogger(__name__)

TICK_S = 0.1
ANSWER_POLL_S = 0.02  # while a run of row changes is being applied, how often its answer is looked for between ticks
FEED_INTERVAL_S = 1.0  # how often a table's leader looks for changes to feed its pipelines
ACQUIRE_EVERY_S = 1.0  # how often a table another committer leads is tried (its lease expires 10 s after its leader's last renewal)


class Committer:
    def __init__(self, settings: Settings, client: redis.Redis, catalog: Catalog, name: str | None = None) -> None:
        self.settings = settings
        self.client = client
        self.catalog = catalog
        self.name = name or consumer_name()
        self.schedule = CommitSchedule(settings.commit_interval_s, settings.commit_min_interval_s)
        self.upkeep_schedule = UpkeepSchedule(settings.upkeep_interval_s)
        self.orphan_schedule = UpkeepSchedule(settings.orphan_interval_s)
        self.feed_schedule = UpkeepSchedule(FEED_INTERVAL_S)
        self.feeds = FeedPump(settings, client)
        self.leases: dict[str, TableLease] = {}
        self._tried: dict[str, float] = {}  # tables another committer leads: when this one last tried to take them
        self.publisher = ReceiptPublisher(client)
        self.commits = TableCommits(settings, client, catalog, self.name, self.publisher)
        self.upkeep = TableUpkeep(settings, client, catalog)

    def run(self, stop: threading.Event) -> None:
        log.info("committer %s started", self.name)
        heartbeats = Heartbeats(self.client, "committer", self.name)
        while not stop.is_set():
            try:
                heartbeats.beat(leads=len(self.leases))
                self.tick()
            except redis.RedisError as exc:
                log.warning("committer: Redis unavailable (%s); retrying", exc)
                stop.wait(1.0)
                continue
            self.pause(stop)
        self.drain()
        self.release_all()
        with contextlib.suppress(redis.RedisError):
            heartbeats.stop()
        log.info("committer %s stopped", self.name)

    def pause(self, stop: threading.Event) -> None:
        """Wait a tick, or less when the answer to a run of row changes arrives meanwhile: a
        producer waits on each run, and a whole tick's wait is a tenth of a run's length. An
        answer already in (its commit failing: the catalog away, say) is retried once a tick."""
        deadline = time.monotonic() + TICK_S
        awaited = [keys.applying_key(*keys.split_member(member)) for member in self.commits.changes.asked_at if member in self.leases]
        awaited = [key for key in awaited if not self.client.hexists(key, changes.RESULT)]
        while awaited and (left := deadline - time.monotonic()) > 0:
            if stop.wait(min(ANSWER_POLL_S, left)) or any(self.client.hexists(key, changes.RESULT) for key in awaited):
                return
        stop.wait(max(0.0, deadline - time.monotonic()))

    def drain(self) -> None:
        """On shutdown: commit what is pending for the tables this committer leads, interval or not."""
        for member, lease in list(self.leases.items()):
            tenant, table = keys.split_member(member)
            try:
                if lease.renew() and self.commits.commit_table(tenant, table, lease):
                    log.info("committer %s committed %s while shutting down", self.name, member)
            except Exception:
                log.exception("committer: final commit of %s failed; the next leader will commit it", member)

    def tick(self) -> None:
        """Each table's upkeep, feeds and commit as they are due. Redis is asked per tick, not per
        table (in one round trip, or now and then): at 300 idle tables, one round trip per table
        and tick for its lease and one for its commit stream kept a committer at 22% of a core."""
        asked = {text(m) for m in self.client.smembers(keys.MAINTENANCE)}
        members = sorted(text(m) for m in self.client.smembers(keys.TABLES))
        pending = self._pending([member for member in members if member in self.leases])  # (one taken this tick: the next tick's)
        for member in members:
            lease = self.lease(member)
            if lease is None:
                continue
            now = time.monotonic()
            tenant, table = keys.split_member(member)
            if member in asked:
                self.upkeep.maintain(tenant, table, lease)
            if self.upkeep_schedule.is_upkeep_due(member, now):
                self.upkeep.run_scheduled(tenant, table, lease)
                self.upkeep_schedule.record_upkeep(member, now)
            if self.orphan_schedule.is_upkeep_due(member, now):
                self.upkeep.remove_orphans(tenant, table, lease)
                self.orphan_schedule.record_upkeep(member, now)
            if self.feed_schedule.is_upkeep_due(member, now):
                self.pump_feeds(tenant, table)
                self.feed_schedule.record_upkeep(member, now)
            # Only a table with entries in its commit stream (files handed off, row changes, or
            # entries committed but not yet announced) is loaded from the catalog; one whose next
            # entries are row changes waiting for their run, only once the run is due or, when its
            # commit is due, a new append waits behind them (committed ahead of them, and their run
            # asked for at once); one whose run is being applied, once its answer is in or such an
            # append waits.
            ahead_due = self.schedule.is_commit_due(member, now) or self.schedule.may_commit_ahead(member, now)
            if member in self.commits.changes.asked_at:
                # Its run's answer is looked for at every tick.
                due = self.commits.changes.answered(tenant, table) or ahead_due and self.commits.append_waiting(tenant, table)
            elif member in self.commits.waiting_for_run:
                due = self.schedule.is_run_due(member, now) or ahead_due and self.commits.append_waiting(tenant, table)
            else:
                due = self.schedule.is_commit_due(member, now) or self.schedule.may_commit_early(member, now)
            if due and pending.get(member, 0):
                self.commit(member, lease, now)

    def _pending(self, members: list[str]) -> dict[str, int]:
        """How many entries wait in each table's commit stream (handed-off files, row changes,
        or commits not yet announced), as the tick starts: one round trip for all. An entry handed
        off meanwhile waits for the next tick."""
        pipe = self.client.pipeline(transaction=False)
        for member in members:
            pipe.xlen(keys.commit_stream_key(*keys.split_member(member)))
        return dict(zip(members, pipe.execute())) if members else {}

    def commit(self, member: str, lease: TableLease, now: float) -> None:
        """The table's commit, its failure counted and backed off: a failure that does not pass
        (commit_max_failures in a row) has its entries committed one by one, and the bad one parked."""
        tenant, table = keys.split_member(member)
        started = time.monotonic()
        try:
            committed = self.commits.commit_table(
                tenant, table, lease, lambda interval_s: self.schedule.set_interval(member, interval_s), self.schedule.is_run_due(member, now),
            )
            self.schedule.record_work(member, started, time.monotonic(), committed)
            if committed:
                self.schedule.record_commit(member, now)
            if (asked := self.commits.changes.committed_run(member)) is not None:
                self.schedule.record_run(member, asked, time.monotonic())
                self.upkeep.compact_after_run(tenant, table, lease)
            self.schedule.record_success(member)
        except LeadershipLost:
            log.warning("committer %s lost the lease of %s before committing", self.name, member)
            self.leases.pop(member, None)
        except TRANSIENT as exc:  # the catalog is away or busy: nothing is wrong with the entries
            metrics.COMMIT_FAILURES.labels(tenant, table, "unavailable").inc()
            log.warning("committer: commit of %s failed (%s); will retry%s", member, exc, locked_by(self.settings.resolved_catalog_uri(), exc))
            self.schedule.record_commit(member, now)  # back off one interval
        except Exception:
            metrics.COMMIT_FAILURES.labels(tenant, table, "error").inc()
            log.exception("committer: commit of %s failed; will retry", member)
            self.schedule.record_commit(member, now)  # back off one interval
            if self.schedule.record_failure(member) >= self.settings.commit_max_failures:
                self.schedule.record_success(member)
                self.commits.isolate_stuck(tenant, table, lease)

    def pump_feeds(self, tenant: str, table_name: str) -> None:
        """Put the table's new changes on the input of the pipelines it feeds (committer/feeds.py)."""
        try:
            self.feeds.pump(tenant, table_name, lambda: self.catalog.load_table(table_identifier(self.catalog, tenant, table_name)))
        except Exception:
            log.exception("committer: feeding the pipelines of %s/%s failed; will retry", tenant, table_name)

    def lease(self, member: str) -> TableLease | None:
        """This committer's lease on the table, renewed once a fifth of it has passed, or None when
        another committer leads (tried again ACQUIRE_EVERY_S later)."""
        lease = self.leases.get(member)
        now = time.monotonic()
        if lease is not None:
            if lease.renewed_lately(now) or lease.renew():
                return lease
            log.warning("committer %s lost the lease of %s", self.name, member)
            del self.leases[member]
        if now - self._tried.get(member, float("-inf")) < ACQUIRE_EVERY_S:
            return None  # another committer led it a moment ago
        tenant, table = keys.split_member(member)
        lease = TableLease(self.client, tenant, table, self.name, int(self.settings.lease_s * 1000))
        if not lease.acquire():
            self._tried[member] = now
            return None
        self._tried.pop(member, None)
        log.info("committer %s leads %s (fence %d)", self.name, member, lease.fence)
        self.leases[member] = lease
        return lease

    def release_all(self) -> None:
        for lease in self.leases.values():
            with contextlib.suppress(redis.RedisError):
                lease.release()
        self.leases.clear()


def locked_by(catalog_uri: str, exc: Exception) -> str:
    """For an SQLite catalog locked past its busy timeout, who holds its write lock, to add to the
    failure's warning (a process frozen inside its catalog write holds it until it runs again:
    README, Known limits); "" otherwise."""
    if not (isinstance(exc, OperationalError) and "database is locked" in str(exc)):
        return ""
    holders = sqlite_write_lock_holders(catalog_uri)
    if not holders:
        return ""
    return (f". The SQLite catalog's write lock is held by process {', '.join(map(str, holders))}: if it stays held, that "
            "process is stuck or stopped inside its catalog write (a SIGSTOP, a paused VM); resume or kill it")
