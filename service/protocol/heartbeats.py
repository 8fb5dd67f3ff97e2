"""Heartbeats: each writer and committer says, every few seconds, that it is alive (and a writer,
whether its last Spark job reached Spark). `/metrics` reads them at scrape time, so whichever api
serves the scrape tells which roles are alive, whatever process died without a word.

One Redis hash, `calve:heartbeats`: field `<role>/<name>`, value JSON `{"at": unix s, ...facts}`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import orjson
import redis

from service.core import keys

INTERVAL_S = 5.0  # how often a process beats
STALE_S = 15.0  # a process not heard from for this long is not counted alive
FORGET_S = 3600.0  # its entry is removed after this (a process gone for good)
SPARK_REACHABLE = "spark"  # writers: false while their jobs wait out a Spark Connect outage


@dataclass(frozen=True)
class Heartbeat:
    role: str
    name: str
    at: float
    facts: dict

    @property
    def field(self) -> str:
        return f"{self.role}/{self.name}"

    def to_value(self) -> bytes:
        return orjson.dumps({"at": self.at, **self.facts})

    @classmethod
    def from_field(cls, field: bytes | str, value: bytes | str) -> Heartbeat:
        role, _, name = (field.decode() if isinstance(field, bytes) else field).partition("/")
        body = orjson.loads(value)
        at = float(body.pop("at", 0))
        return cls(role, name, at, body)


class Heartbeats:
    """A process's own heartbeat, sent at most every INTERVAL_S."""

    def __init__(self, client: redis.Redis, role: str, name: str) -> None:
        self.client = client
        self.role = role
        self.name = name
        self._last = 0.0

    def beat(self, **facts: object) -> None:
        now = time.time()
        if now - self._last < INTERVAL_S:
            return
        self._last = now
        beat = Heartbeat(self.role, self.name, now, facts)
        self.client.hset(keys.HEARTBEATS, beat.field, beat.to_value())

    def stop(self) -> None:
        """Leaving on purpose: no longer counted, at once."""
        self.client.hdel(keys.HEARTBEATS, f"{self.role}/{self.name}")


def alive(client: redis.Redis, now: float | None = None) -> list[Heartbeat]:
    """The processes heard from within STALE_S; entries older than FORGET_S are removed."""
    now = time.time() if now is None else now
    beats = [Heartbeat.from_field(f, v) for f, v in client.hgetall(keys.HEARTBEATS).items()]
    gone = [beat.field for beat in beats if now - beat.at > FORGET_S]
    if gone:
        client.hdel(keys.HEARTBEATS, *gone)
    return [beat for beat in beats if now - beat.at <= STALE_S]
