"""The Lua scripts that write the records of this package, each atomic in one Redis (Cluster)
slot: every key a script touches is declared in KEYS and carries the tenant's hash tag.

Field names come from the record modules; `$name` placeholders are filled in once, at import.
"""

from __future__ import annotations

from string import Template

from service.protocol import input_entry, receipts

BACKLOG_FULL = 3  # BUFFER's answer to a request over its tenant's backlog cap (beside take_tokens' 1 and 2)

_FIELDS = {
    "entry_receipt": input_entry.RECEIPT, "entry_events": input_entry.EVENTS, "entry_body": input_entry.BODY,
    "entry_replays": input_entry.REPLAYS,
    "status": receipts.STATUS, "events": receipts.EVENTS, "pipeline": receipts.PIPELINE,
    "created_at": receipts.CREATED_AT, "tables": receipts.TABLES, "committed_at": receipts.COMMITTED_AT,
    "committed_prefix": receipts.COMMITTED_PREFIX, "committed_prefix_len": str(len(receipts.COMMITTED_PREFIX)),
    "backlog_full": str(BACKLOG_FULL), "buffered": receipts.BUFFERED, "committed": receipts.COMMITTED, "failed": receipts.FAILED, "error": receipts.ERROR,
}


def _lua(source: str) -> str:
    return Template(source).substitute(_FIELDS)


# Rate: two token buckets (events/s and bytes/s) refilled continuously, holding up to `burst` seconds
# of traffic, checked and charged together (tenancy/limits.py). Returns 0, 0 (charged) | 1, ms until
# enough has refilled | 2, the index of the bucket too small for the cost.
TAKE_TOKENS = """
local function take_tokens(bucket_keys, now, burst, rates, costs, only_look)
  local level = {}
  for i = 1, 2 do
    local capacity = rates[i] * burst
    if costs[i] > capacity then return 2, i end
    local state = redis.call('HMGET', bucket_keys[i], 'tokens', 'ts')
    local tokens = tonumber(state[1]) or capacity
    local ts = tonumber(state[2]) or now
    level[i] = math.min(capacity, tokens + math.max(0, now - ts) / 1000 * rates[i])
  end
  local wait = 0
  for i = 1, 2 do
    if costs[i] > level[i] then wait = math.max(wait, (costs[i] - level[i]) / rates[i] * 1000) end
  end
  if wait > 0 then return 1, math.ceil(wait) end
  if only_look then return 0, 0 end
  for i = 1, 2 do
    redis.call('HSET', bucket_keys[i], 'tokens', tostring(level[i] - costs[i]), 'ts', tostring(now))
    redis.call('PEXPIRE', bucket_keys[i], math.ceil(burst * 1000) + 60000)
  end
  return 0, 0
end
"""

# The api accepts a request: receipt, input entry and backlog in one step. With an idempotency
# key (ARGV[7] = '1') only the first request holding it gets in; a retry gets the first one's
# receipt id back. With the tenant's limits (ARGV[10..]), a request over its backlog cap or its
# rate is refused first, nothing charged or buffered: {BACKLOG_FULL, 0} or take_tokens' verdict.
# One step instead of three, as each round trip costs the api's loop more than the work.
# KEYS: idempotency key, receipt, input stream, backlog, then with limits the two rate buckets.
# ARGV: receipt id, events, pipeline, created_at, receipt ttl, body, idempotent?, window, replays,
# then with limits: backlog cap, now (ms), burst (s), events/s, bytes/s, bytes.
BUFFER = TAKE_TOKENS + _lua("""
if ARGV[7] == '1' then
  local first = redis.call('GET', KEYS[1])
  if first then return first end
end
if ARGV[10] then
  if (tonumber(redis.call('GET', KEYS[4])) or 0) >= tonumber(ARGV[10]) then return {$backlog_full, 0} end
  local verdict, detail = take_tokens({KEYS[5], KEYS[6]}, tonumber(ARGV[11]), tonumber(ARGV[12]),
    {tonumber(ARGV[13]), tonumber(ARGV[14])}, {tonumber(ARGV[2]), tonumber(ARGV[15])})
  if verdict ~= 0 then return {verdict, detail} end
end
if ARGV[7] == '1' then redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[8]) end
redis.call('HSET', KEYS[2], '$status', '$buffered', '$events', ARGV[2], '$pipeline', ARGV[3], '$created_at', ARGV[4])
redis.call('EXPIRE', KEYS[2], ARGV[5])
if ARGV[9] ~= '' then
  redis.call('XADD', KEYS[3], '*', '$entry_receipt', ARGV[1], '$entry_events', ARGV[2], '$entry_body', ARGV[6], '$entry_replays', ARGV[9])
else
  redis.call('XADD', KEYS[3], '*', '$entry_receipt', ARGV[1], '$entry_events', ARGV[2], '$entry_body', ARGV[6])
end
redis.call('INCRBY', KEYS[4], ARGV[2])
return false
""")


# What BUFFER would answer about a tenant's limits, charging nothing: {0, 0} when it would let the
# request through, else its refusal. For a request not read yet (api/routes/ingest.py
# looked_at), so costs are the least the request holds; a retry holding an idempotency key
# already taken is let through (BUFFER answers it with the first request's receipt).
# KEYS: idempotency key, backlog, the two rate buckets. ARGV: idempotent?, backlog cap, now (ms),
# burst (s), events/s, bytes/s, events, bytes.
LOOK = TAKE_TOKENS + _lua("""
if ARGV[1] == '1' and redis.call('EXISTS', KEYS[1]) == 1 then return {0, 0} end
if (tonumber(redis.call('GET', KEYS[2])) or 0) >= tonumber(ARGV[2]) then return {$backlog_full, 0} end
local verdict, detail = take_tokens({KEYS[3], KEYS[4]}, tonumber(ARGV[3]), tonumber(ARGV[4]),
  {tonumber(ARGV[5]), tonumber(ARGV[6])}, {tonumber(ARGV[7]), tonumber(ARGV[8])}, true)
return {verdict, detail}
""")


# The writer settles a batch only while it owns every entry (see writer/hand_off.py): records the
# files on commit streams, updates receipts, acknowledges and deletes the input, lowers the backlog
# for receipts complete already. KEYS[1]: the input stream; KEYS[2..]: the keys the plan names by
# index. ARGV: group, consumer, plan (JSON: ids, xadd [[key, fields]], hset [[key, fields]],
# decr [key, amount] or null).
SETTLE = _lua("""
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
""")

# The api registers files written elsewhere (api/routes/files.py) only while none of their
# deduplication keys (KEYS[4..]) is taken: then it takes them all (with a time to live), creates
# the receipt (KEYS[1]), appends the commit entry (KEYS[2]) and notes the registrations in a capped
# list (KEYS[3]); else it changes nothing and returns the positions (1-based, in KEYS[4..]) of the
# keys already taken. ARGV: the keys' value (the receipt id), their ttl, the receipt's fields (JSON
# list), the receipt's ttl, the entry's fields (JSON list), the registrations (JSON list of JSON
# texts), how many registrations the list keeps.
REGISTER = """
local taken = {}
for i = 4, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then taken[#taken + 1] = i - 3 end
end
if #taken > 0 then return taken end
for i = 4, #KEYS do redis.call('SET', KEYS[i], ARGV[1], 'EX', ARGV[2]) end
redis.call('HSET', KEYS[1], unpack(cjson.decode(ARGV[3])))
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('XADD', KEYS[2], '*', unpack(cjson.decode(ARGV[5])))
for _, item in ipairs(cjson.decode(ARGV[6])) do redis.call('LPUSH', KEYS[3], item) end
redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[7]) - 1)
return taken
"""

# The committer marks one table of receipts committed (KEYS[2..]); each receipt all of whose tables
# are committed is marked committed and its events leave the tenant's backlog (KEYS[1]). The
# receipts this call completed are announced once, on the channel ARGV[3], with their fields (a
# JSON object of ids to fields: a request waiting on one answers without reading it again, and
# the committer's Python spends nothing per receipt on it). For each receipt, returns its
# created_at only when this call completed it (else 0). One call for many receipts: a Redis
# Cluster runs no script inside a pipeline. ARGV: table, committed_at, channel, then
# "<snapshot id>:<rows>" per receipt, then each receipt's id.
MARK_COMMITTED = _lua("""
local done_at, settled, any = {}, {}, false
local receipts = #KEYS - 1
for i = 2, #KEYS do
  local key, result = KEYS[i], 0
  if redis.call('EXISTS', key) == 1 then
    redis.call('HSET', key, '$committed_prefix' .. ARGV[1], ARGV[i + 2])
    local status = redis.call('HGET', key, '$status')
    if status ~= '$committed' and status ~= '$failed' then
      local expected = tonumber(redis.call('HGET', key, '$tables') or '0')
      local done = 0
      for _, name in ipairs(redis.call('HKEYS', key)) do
        if string.sub(name, 1, $committed_prefix_len) == '$committed_prefix' then done = done + 1 end
      end
      if done >= expected then
        redis.call('HSET', key, '$status', '$committed', '$committed_at', ARGV[2])
        redis.call('DECRBY', KEYS[1], tonumber(redis.call('HGET', key, '$events') or '0'))
        local fields, receipt = redis.call('HGETALL', key), {}
        for j = 1, #fields, 2 do receipt[fields[j]] = fields[j + 1] end
        settled[ARGV[receipts + i + 2]], any = receipt, true
        result = receipt['$created_at'] or '0'
      end
    end
  end
  done_at[i - 1] = result
end
if any then redis.call('PUBLISH', ARGV[3], cjson.encode(settled)) end
return done_at
""")

# The committer gives up on a commit-stream entry that can never be committed: each of its receipts
# (KEYS[2..]) not settled yet becomes failed with the reason and leaves the tenant's backlog
# (KEYS[1]). A later commit of the receipt's other tables (or of this entry, retried by hand)
# records its snapshot but leaves the status failed: the producer was told. ARGV: reason,
# failed_at. Returns 1 per receipt it failed, else 0.
MARK_FAILED = _lua("""
local failed = {}
for i = 2, #KEYS do
  local status = redis.call('HGET', KEYS[i], '$status')
  failed[i - 1] = 0
  if status ~= false and status ~= '$committed' and status ~= '$failed' then
    redis.call('HSET', KEYS[i], '$status', '$failed', '$error', ARGV[1], '$committed_at', ARGV[2])
    redis.call('DECRBY', KEYS[1], tonumber(redis.call('HGET', KEYS[i], '$events') or '0'))
    failed[i - 1] = 1
  end
end
return failed
""")

# A committer extends its lease on a table (committer/leases.py) only while it still holds it.
# KEYS[1]: the lease. ARGV: owner, lease ms. Returns 0 when another owner (or nobody) holds it.
RENEW_LEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# A committer gives a lease up only while it still holds it. KEYS[1]: the lease. ARGV: owner.
RELEASE_LEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
