"""A writer's unit of work: entries of one input stream, read together."""

from __future__ import annotations

from dataclasses import dataclass, field

import redis

from service.core import keys
from service.protocol.input_entry import InputEntry
from service.protocol.stream_ids import text


@dataclass
class Batch:
    """Entries of one input stream, read together."""

    tenant: str
    pipeline: str
    entries: list[InputEntry] = field(default_factory=list)
    events: int = 0
    size: int = 0
    failures: int = 0  # Spark jobs of exactly these entries that failed

    def add(self, entry: InputEntry) -> None:
        self.entries.append(entry)
        self.events += entry.events
        self.size += len(entry.body)

    def halves(self) -> list[Batch]:
        middle = len(self.entries) // 2
        parts = []
        for entries in (self.entries[:middle], self.entries[middle:]):
            part = Batch(self.tenant, self.pipeline)
            for entry in entries:
                part.add(entry)
            parts.append(part)
        return parts


def pending_of(client: redis.Redis, stream: str, entries: list[InputEntry], owner: str) -> dict[str, dict]:
    """Of `entries`, those still pending for `owner` in the writers' group, by id, with XPENDING's
    row for each (times_delivered, time_since_delivered)."""
    if not entries:
        return {}
    rows = client.xpending_range(stream, keys.WRITER_GROUP, min=entries[0].id, max=entries[-1].id,
                                 count=len(entries), consumername=owner)
    return {text(row["message_id"]): row for row in rows}
