"""The committer's announcement of settled receipts (service/committer/receipts.py), on a real Redis."""

from __future__ import annotations

import orjson
import redis

from service.committer.receipts import ReceiptPublisher
from service.core import keys
from service.protocol.receipts import parse_receipt


def written(client: redis.Redis, receipt: str, tables: int, events: int, **more: str) -> None:
    fields = {"status": "written", "tables": str(tables), "events": str(events), "created_at": "1.5", **more}
    client.hset(keys.receipt_key("demo", receipt), mapping=fields)


def stored(client: redis.Redis, receipt: str) -> dict[str, str]:
    return {name.decode(): value.decode() for name, value in client.hgetall(keys.receipt_key("demo", receipt)).items()}


def test_a_receipt_is_announced_once_with_its_fields_by_the_commit_that_completes_it(redis_client: redis.Redis) -> None:
    channel = redis_client.pubsub()
    channel.subscribe(keys.COMMITTED_CHANNEL)
    assert channel.get_message(timeout=2)["type"] == "subscribe"
    written(redis_client, "two-tables", 2, 10)
    written(redis_client, "dropped", 1, 3, **{"dropped:logs": '["a/b","é \\"q\\""]'})
    written(redis_client, "plain", 1, 4)
    publisher = ReceiptPublisher(redis_client)

    assert publisher.mark_committed("demo", "logs", 123, {"two-tables": 7, "dropped": 3, "plain": 4}) == ["dropped", "plain"]
    announced = orjson.loads(channel.get_message(timeout=2)["data"])
    assert announced == {"dropped": stored(redis_client, "dropped"), "plain": stored(redis_client, "plain")}
    assert parse_receipt("dropped", announced["dropped"]).tables["logs"] == {"rows": 3, "snapshot_id": 123, "dropped_fields": ["a/b", 'é "q"']}

    assert publisher.mark_committed("demo", "dlq", 9, {"two-tables": 3}) == ["two-tables"]
    announced = orjson.loads(channel.get_message(timeout=2)["data"])
    assert announced == {"two-tables": stored(redis_client, "two-tables")}
    assert announced["two-tables"]["status"] == "committed"

    assert publisher.mark_committed("demo", "dlq", 9, {"two-tables": 3}) == []  # settled already: not again
    assert channel.get_message(timeout=0.5) is None
    channel.close()
