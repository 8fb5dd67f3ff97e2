"""One buffered HTTP request: an entry of a tenant's input stream (api -> writer)."""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

from service.protocol.stream_ids import text
from spark_jobs.contract import ENTRY_BODY

# Field names of the stream entry; the api's buffering script takes them from here.
RECEIPT = "receipt"
EVENTS = "events"
BODY = ENTRY_BODY  # NDJSON: one event per line (a line starting with "!" is an event set aside)
REPLAYS = "replays"  # JSON list of dlq_ids a DLQ replay re-runs (absent otherwise)


@dataclass
class InputEntry:
    id: str
    receipt: str
    events: int
    body: bytes
    replays: list[str] = field(default_factory=list)

    @classmethod
    def from_fields(cls, entry_id: bytes | str, fields: dict[bytes, bytes]) -> InputEntry:
        replays = fields.get(REPLAYS.encode())
        return cls(
            id=text(entry_id),
            receipt=text(fields[RECEIPT.encode()]),
            events=int(fields[EVENTS.encode()]),
            body=fields[BODY.encode()],
            replays=orjson.loads(replays) if replays else [],
        )
