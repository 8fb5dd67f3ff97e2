"""Pipelines fed by a table's change feed (`source: {table: NAME}`), pumped by the table's leader.

Each such pipeline reads the table's changes as a consumer named `pipeline:<name>` (so expiry
keeps what it has not read, like any consumer's; the pipeline store drops that consumer when the
pipeline is deleted or stops reading the table), and puts each page of changes on the pipeline's
input stream as one request, exactly as the api buffers a producer's request: from there the
writer and the committer treat it like any other. Each changed row becomes an event: its columns
(not the feed's _snapshot_id, _committed_at and _document_id), plus `_change_type` = `insert`
for an INSERT or UPDATE_AFTER (an insert of an existing key replaces its row) or `delete` for a
DELETE; UPDATE_BEFORE rows are dropped (the UPDATE_AFTER of the same key replaces the row). The
cursor is acknowledged after the request is buffered; the request's idempotency key is the
page's starting cursor, so a leader that dies in between and a new leader that reads the page
again buffer it once.
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid

import orjson
import redis
from pyiceberg.table import Table
from sqlmodel import Session

from service.core import keys
from service.core.config import Settings
from service.core.db import get_engine
from service.core.exceptions import ChangelogError, NotFound
from service.core.models import PIPELINE_CONSUMER_PREFIX
from service.feeds.consumers import ConsumerStore
from service.feeds.cursors import Cursor
from service.feeds.pages import read_page
from service.feeds.spark_diffs import SparkDiffs
from service.iceberg.changelog import CHANGE_TYPE, DELETE, INSERT, METADATA_COLUMNS, UPDATE_AFTER
from service.pipelines.spec import FEED_OPERATION
from service.pipelines.store import PipelineRecord, table_feeds
from service.protocol import scripts

log = logging.getLogger(__name__)

PAGE_ROWS = 5000
PUMP_BUDGET_S = 1.0  # per table and tick: pages until this is spent or the feed is read
PIPELINES_CACHE_S = 2.0
OPERATIONS = {INSERT: "insert", UPDATE_AFTER: "insert", DELETE: "delete"}


def consumer_name(pipeline: str) -> str:
    return f"{PIPELINE_CONSUMER_PREFIX}{pipeline}"


def events(batches: list) -> tuple[bytes, int]:
    """NDJSON events of a page of changes, and how many."""
    lines = []
    for batch in batches:
        for row in batch.to_pylist(maps_as_pydicts="lossy"):  # a map column is a JSON object, as events send it
            operation = OPERATIONS.get(row.pop(CHANGE_TYPE))
            if operation is None:
                continue
            for column in METADATA_COLUMNS:
                row.pop(column, None)
            row[FEED_OPERATION] = operation
            lines.append(orjson.dumps(row, default=str, option=orjson.OPT_NON_STR_KEYS))
    return b"\n".join(lines), len(lines)


class FeedPump:
    def __init__(self, settings: Settings, client: redis.Redis) -> None:
        self.settings = settings
        self.client = client
        self._buffer = client.register_script(scripts.BUFFER)
        self._feeds: dict[tuple[str, str], list[PipelineRecord]] = {}  # by (tenant, table): the pipelines its changes feed
        self._feeds_read_at = float("-inf")
        self.differ = SparkDiffs(client, settings.feed_spark_rows, settings.feed_diff_timeout_s)

    def _engine(self):  # noqa: ANN202
        return get_engine(self.settings.resolved_database_url())

    def fed_by(self, tenant: str, table_name: str) -> list[PipelineRecord]:
        """The pipelines reading `table_name`'s changes: every table's found by one query every
        PIPELINES_CACHE_S, parsing only their definitions (once per version: store.stored_definition)."""
        if time.monotonic() - self._feeds_read_at > PIPELINES_CACHE_S:
            with Session(self._engine()) as session:
                self._feeds = table_feeds(session)
            self._feeds_read_at = time.monotonic()
        return self._feeds.get((tenant, table_name), [])

    def pump(self, tenant: str, table_name: str, load_table) -> int:  # noqa: ANN001 - () -> Table
        """Buffer the next changes of `table_name` for each pipeline it feeds; the events buffered."""
        pipelines = self.fed_by(tenant, table_name)
        if not pipelines or self._backlog_full(tenant):
            return 0
        with Session(self._engine()) as session:
            store = ConsumerStore(session, tenant)
            table = load_table()
            return sum(self._pump_one(store, table, table_name, record) for record in pipelines)

    def _backlog_full(self, tenant: str) -> bool:
        return int(self.client.get(keys.backlog_key(tenant)) or 0) >= self.settings.max_backlog_events // 2

    def _pump_one(self, store: ConsumerStore, table: Table, table_name: str, record: PipelineRecord) -> int:
        name = consumer_name(record.name)
        try:
            consumer = store.get(table_name, name)
        except NotFound:
            consumer = store.create(table, table_name, name, "latest", record.definition.source.initial_load)
        if consumer.lagging_since is not None:
            return 0
        buffered, started = 0, time.monotonic()
        while time.monotonic() - started < PUMP_BUDGET_S:
            start = Cursor.parse(consumer.cursor)
            try:
                page = read_page(table, start, PAGE_ROWS, self.differ)
            except ChangelogError as exc:
                log.error("pipeline %s/%s cannot read the changes of table %s: %s", store.tenant, record.name, table_name, exc)
                store.mark_lagging(consumer)
                return buffered
            body, count = events(page.batches)
            if count:
                self._buffer_request(store.tenant, record.name, body, count, f"{record.name}@{start.text()}")
                buffered += count
            if page.cursor != start:
                consumer = store.ack(table, consumer, page.cursor)
            if not page.more:
                break
        return buffered

    def _buffer_request(self, tenant: str, pipeline: str, body: bytes, count: int, idempotency: str) -> None:
        receipt_id = uuid.uuid4().hex
        digest = hashlib.sha256(f"feed:{idempotency}".encode()).hexdigest()
        self._buffer(
            keys=[keys.idempotency_key(tenant, digest), keys.receipt_key(tenant, receipt_id),
                  keys.input_stream_key(tenant, pipeline), keys.backlog_key(tenant)],
            args=[receipt_id, count, pipeline, f"{time.time():.3f}", self.settings.receipt_ttl_s, body, "1",
                  self.settings.idempotency_window_s, ""],
        )
        self.client.sadd(keys.INPUT_STREAMS, keys.member(tenant, pipeline))
