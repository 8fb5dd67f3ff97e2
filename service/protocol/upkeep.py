"""The last run of each upkeep task of a table, kept for its health (GET /v1/tables/{name}) and
for whoever asked for it by hand (POST /v1/tables/{name}/maintenance waits for its request id).

The committer writes them (a table's leader runs upkeep), and so does a writer whose compaction
failed; the api reads them. The JSON is what the api answers, so its keys are part of the API.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import orjson
import redis

from service.core import keys


class UpkeepTask(StrEnum):
    EXPIRE = "expire"
    COMPACT = "compact"
    ORPHANS = "orphans"
    MANIFESTS = "manifests"


class UpkeepOutcome(StrEnum):
    OK = "ok"
    FAILED = "failed"
    REQUESTED = "requested"  # a compaction handed to the writers; ok, dropped or failed follows
    BUSY = "busy"  # a compaction of the table is already running
    DROPPED = "dropped"  # a compaction whose rewrite could not be committed


_KNOWN = ("outcome", "request", "error", "detail", "seconds", "at_ms")


@dataclass(frozen=True)
class UpkeepRun:
    """One run of an upkeep task: its outcome and what it did (`facts`: files deleted, snapshots
    expired, files rewritten, ...)."""

    outcome: UpkeepOutcome
    request: str | None = None  # the id of the request it answers (by hand, or a compaction's)
    error: str | None = None
    detail: str | None = None
    seconds: float | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    at_ms: int | None = None

    @classmethod
    def failed(cls, exc: BaseException, request: str | None = None) -> UpkeepRun:
        return cls(UpkeepOutcome.FAILED, request=request, error=str(exc)[:500])

    @property
    def settled(self) -> bool:
        """Whether nothing more is to come of it (a requested compaction is still running)."""
        return self.outcome is not UpkeepOutcome.REQUESTED

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"outcome": self.outcome.value, "request": self.request}
        for name in ("error", "detail", "seconds", "at_ms"):
            if getattr(self, name) is not None:
                body[name] = getattr(self, name)
        return body | self.facts

    @classmethod
    def from_json(cls, raw: bytes | str) -> UpkeepRun:
        body = orjson.loads(raw)
        return cls(
            UpkeepOutcome(body.get("outcome", UpkeepOutcome.OK)), body.get("request"), body.get("error"), body.get("detail"),
            body.get("seconds"), {name: value for name, value in body.items() if name not in _KNOWN}, body.get("at_ms"),
        )

    def record(self, client: redis.Redis, tenant: str, table: str, task: UpkeepTask) -> None:
        """Keep it as the task's last run, stamped now."""
        client.hset(keys.upkeep_key(tenant, table), task.value, orjson.dumps(self.to_dict() | {"at_ms": int(time.time() * 1000)}))
