"""Consumers of a table's change feed: a name and an acknowledged cursor per table, in the
metadata DB so that they outlive every process.

At least once: a page of changes does not move the cursor, an ack does; a consumer that does
not ack reads the same changes again. While a consumer's cursor needs a snapshot, the table's
leader does not expire it nor any snapshot after it (`protected_snapshots`), for at most
`consumer_max_lag_s`; past that the snapshots go as the table's policy says, and a consumer that
then finds its snapshot gone is marked lagging and must start again with an initial load.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select

from service.core.exceptions import AlreadyExists, CursorBehind, NotFound
from service.core.models import ChangeConsumer, utcnow
from service.feeds.cursors import LOAD, ORIGIN, Cursor
from service.iceberg.changelog import is_first, lineage
from service.tenancy.tenants import tenant_id

EARLIEST, LATEST = "earliest", "latest"


def _ancestors(table: Table) -> list[Snapshot]:
    """The current snapshot and its ancestors still in the table, newest first."""
    path, snapshot = [], table.current_snapshot()
    while snapshot is not None:
        path.append(snapshot)
        snapshot = table.metadata.snapshot_by_id(snapshot.parent_snapshot_id) if snapshot.parent_snapshot_id is not None else None
    return path


def start_cursor(table: Table, start: str, initial_load: bool) -> Cursor:
    """Where a new consumer begins: `latest` (the current snapshot), `earliest` (the oldest one
    still kept; from before the table's first snapshot if that one is kept) or a snapshot id of
    the current history; with `initial_load`, by reading that snapshot whole first."""
    ancestors = _ancestors(table)
    if not ancestors:
        return Cursor.origin()
    if start == LATEST:
        snapshot = ancestors[0]
    elif start == EARLIEST:
        snapshot = ancestors[-1]
        if not initial_load and is_first(snapshot):
            return Cursor.origin()
    else:
        snapshot_id = int(start)
        lineage(table, snapshot_id)  # raises unless the current history passes through it
        snapshot = table.metadata.snapshot_by_id(snapshot_id)
    return Cursor.loading(snapshot.snapshot_id) if initial_load else Cursor.after(snapshot.snapshot_id)


def _order(table: Table, cursor: Cursor) -> tuple[int, int, int, int]:
    """A sortable position of `cursor` in the table's current history (raises if it is not on it)."""
    if cursor.phase == ORIGIN:
        return (-1, 0, 0, 0)
    index = {snapshot.snapshot_id: rank for rank, snapshot in enumerate(reversed(_ancestors(table)))}
    if cursor.snapshot_id not in index:
        lineage(table, cursor.snapshot_id)  # raises the reason: expired, or not in this history
    rank = index[cursor.snapshot_id]
    if cursor.phase == LOAD:
        return (rank, 0, cursor.file, cursor.offset or 0)
    return (rank, 1, 0, 0) if cursor.offset is None else (rank, 0, 0, cursor.offset)


@dataclass
class ConsumerStore:
    session: Session
    tenant: str

    def _query(self, table_name: str):  # noqa: ANN202 - a SQLModel select
        return select(ChangeConsumer).where(
            ChangeConsumer.tenant_id == tenant_id(self.session, self.tenant), ChangeConsumer.table_name == table_name
        )

    def list(self, table_name: str) -> list[ChangeConsumer]:
        return list(self.session.exec(self._query(table_name).order_by(ChangeConsumer.name)))

    def get(self, table_name: str, name: str) -> ChangeConsumer:
        consumer = self.session.exec(self._query(table_name).where(ChangeConsumer.name == name)).first()
        if consumer is None:
            raise NotFound(f"no consumer {name!r} of table {table_name!r}")
        return consumer

    def create(self, table: Table, table_name: str, name: str, start: str, initial_load: bool) -> ChangeConsumer:
        if self.session.exec(self._query(table_name).where(ChangeConsumer.name == name)).first() is not None:
            raise AlreadyExists(f"consumer {name!r} of table {table_name!r} exists; DELETE it first to start it again")
        cursor = start_cursor(table, start, initial_load)
        consumer = ChangeConsumer(
            tenant_id=tenant_id(self.session, self.tenant), table_name=table_name, name=name,
            cursor=cursor.text(), start=start, initial_load=initial_load,
        )
        self.session.add(consumer)
        try:
            self.session.commit()
        except IntegrityError as exc:
            self.session.rollback()
            raise AlreadyExists(f"consumer {name!r} of table {table_name!r} was created at the same time") from exc
        self.session.refresh(consumer)
        return consumer

    def delete(self, table_name: str, name: str) -> None:
        self.session.delete(self.get(table_name, name))
        self.session.commit()

    def ack(self, table: Table, consumer: ChangeConsumer, cursor: Cursor) -> ChangeConsumer:
        """Move the consumer's checkpoint to `cursor`; never back."""
        if _order(table, cursor) < _order(table, Cursor.parse(consumer.cursor)):
            raise CursorBehind(f"cursor {cursor.text()} is behind consumer {consumer.name!r}'s checkpoint {consumer.cursor}: it was acknowledged already")
        consumer.cursor, consumer.acked_at = cursor.text(), utcnow()
        self.session.add(consumer)
        self.session.commit()
        self.session.refresh(consumer)
        return consumer

    def mark_lagging(self, consumer: ChangeConsumer) -> None:
        if consumer.lagging_since is None:
            consumer.lagging_since = utcnow()
            self.session.add(consumer)
            self.session.commit()


def held_snapshot(table: Table, cursor: Cursor) -> Snapshot | None:
    """The oldest snapshot a reader at `cursor` still reads files of (None: it needs nothing, or
    its snapshot is gone). Within a snapshot that is the snapshot's parent (its removed files)."""
    if cursor.phase == ORIGIN:
        ancestors = _ancestors(table)
        return ancestors[-1] if ancestors else None
    snapshot = table.metadata.snapshot_by_id(cursor.snapshot_id)
    if snapshot is not None and cursor.phase != LOAD and cursor.offset is not None and snapshot.parent_snapshot_id is not None:
        return table.metadata.snapshot_by_id(snapshot.parent_snapshot_id) or snapshot
    return snapshot


def protected_snapshots(session: Session, tenant: str, table_name: str, table: Table, max_lag_s: float) -> set[int]:
    """The snapshots the table's consumers still need: from each one's held snapshot to the
    current one, unless that snapshot is older than `max_lag_s` or the consumer lags."""
    try:
        consumers = ConsumerStore(session, tenant).list(table_name)
    except NotFound:
        return set()
    oldest_ms = int((time.time() - max_lag_s) * 1000)
    ancestors = _ancestors(table)
    protected: set[int] = set()
    for consumer in consumers:
        if consumer.lagging_since is not None:
            continue
        held = held_snapshot(table, Cursor.parse(consumer.cursor))
        if held is None or held.timestamp_ms < oldest_ms:
            continue
        ids = [snapshot.snapshot_id for snapshot in ancestors]
        if held.snapshot_id in ids:  # else it is not on the current history: nothing to keep for it
            protected.update(ids[: ids.index(held.snapshot_id) + 1])
    return protected
