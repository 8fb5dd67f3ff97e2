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

# KEYS[1]: the input stream; KEYS[2..]: the keys the plan's operations name by index.
# ARGV: group, consumer, plan (JSON: ids, xadd [[key, fields]], hset [[key, fields]],
# decr [key, amount] or null).
_SETTLE = """
local group, consumer = ARGV[1], ARGV[2]
local plan = cjson.decode(ARGV[3])
local ids = plan.ids
for _, id in ipairs(ids) do
  local pending = redis.call('XPENDING', KEYS[1], group, id, id, 1)
  if #pending == 0 or pending[1][2] ~= consumer then return 0 end
end
local function each_chunk(list, fn)
  for i = 1, #list, 1000 do
    local chunk = {}
    for j = i, math.min(i + 999, #list) do chunk[#chunk + 1] = list[j] end
    fn(chunk)
  end
end
for _, op in ipairs(plan.xadd) do redis.call('XADD', KEYS[op[1]], '*', unpack(op[2])) end
for _, op in ipairs(plan.hset) do redis.call('HSET', KEYS[op[1]], unpack(op[2])) end
each_chunk(ids, function(chunk) redis.call('XACK', KEYS[1], group, unpack(chunk)) end)
each_chunk(ids, function(chunk) redis.call('XDEL', KEYS[1], unpack(chunk)) end)
if plan.decr ~= cjson.null then redis.call('DECRBY', KEYS[plan.decr[1]], plan.decr[2]) end
return 1
"""


@dataclass
class HandOffPlan:
    xadd: list[tuple[str, list[str]]] = field(default_factory=list)  # (stream, [field, value, ...])
    hset: list[tuple[str, list[str]]] = field(default_factory=list)  # (hash, [field, value, ...])
    lower_backlog: tuple[str, int] | None = None  # (backlog counter, events)


class HandOffScript:
    def __init__(self, client: redis.Redis) -> None:
        self._script = client.register_script(_SETTLE)

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
