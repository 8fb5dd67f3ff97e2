"""The writer's hand-off: one Lua script that settles a batch only while the writer owns it.

A writer whose job outlives the claim idle time looks dead, and another writer may reclaim its
entries (XAUTOCLAIM) and write them too. Whichever of the two settles first wins: the script
checks that every entry is still pending *for this consumer* before it records the files,
updates the receipts and acknowledges the input, all in one atomic step. The loser's files are
never recorded, so they are never committed: no event is written to a table twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson
import redis

from service.protocol import scripts


@dataclass
class HandOffPlan:
    xadd: list[tuple[str, list[str]]] = field(default_factory=list)  # (stream, [field, value, ...])
    hset: list[tuple[str, list[str]]] = field(default_factory=list)  # (hash, [field, value, ...])
    lower_backlog: tuple[str, int] | None = None  # (backlog counter, events)


class HandOffScript:
    def __init__(self, client: redis.Redis) -> None:
        self._script = client.register_script(scripts.SETTLE)

    def run(self, client: redis.Redis, stream: str, group: str, consumer: str, ids: list[str], plan: HandOffPlan) -> int:
        keys = [stream]

        def index(key: str) -> int:
            keys.append(key)
            return len(keys)  # Lua indexes from 1

        body = {
            "ids": ids,
            "xadd": [[index(key), fields] for key, fields in plan.xadd],
            "hset": [[index(key), fields] for key, fields in plan.hset],
            "decr": [index(plan.lower_backlog[0]), plan.lower_backlog[1]] if plan.lower_backlog else None,
        }
        return self._script(keys=keys, args=[group, consumer, orjson.dumps(body)], client=client)
