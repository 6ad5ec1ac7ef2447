"""How a batch of status updates is applied: folded per message, written once per record.

Under load a job's ``running`` and ``succeeded`` (and often its ``queued``) reach the store in the
same batch. Each change still counts: the counters, the per-minute counts and the timeline
(with each change's own time) end exactly as if the updates were applied one at a time, and the
order rules of :mod:`jobsystem.store.status_records` decide each update against the record as
the updates before it left it. What only the final record needs is done once per record and
batch: its fields written, its TTL set, its place in the job index (6 sorted sets per move). A
record's ``ix`` (the state it is filed under) thus moves once, from where the batch found it to
the state the batch leaves it in; an update refused by its order changes only the timeline.

- Redis: :data:`APPLY_LUA`, one script call per batch: each record read once (``HMGET``),
  changed in a Lua table, written with one ``HSET``/``HDEL``/``PEXPIRE``; counters and
  per-minute counts summed and written once per field.
- SQLite: :func:`fold` does the same in Python over the rows it read, so a batch writes each row
  and each counter once.
"""

from __future__ import annotations

from jobsystem.store import job_index, status_history
from jobsystem.store import scheduled as scheduled_index
from jobsystem.store.status_records import REPLAY_STRIDE

__all__ = ["APPLY_LUA"]

#: ``KEYS``: none (keys are the namespace's, ``ARGV[3]``). ``ARGV``: the records' TTL (ms), now
#: (ms), the namespace, and the updates as one JSON array of ``{m, q, o, f, n, d}`` (message id,
#: queue, order, fields, once-fields, deleted fields), in the order they were made.
APPLY_LUA = (
    """
local TTL, NOW, NS = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
"""
    + job_index.INDEX_LUA
    + status_history.HISTORY_LUA
    + scheduled_index.SCHEDULED_LUA
    + """
-- Read with the record: what the updates test, and what a new attempt deletes (no HDEL when absent).
local LOADED = {
  'ord', 'state', 'queue', 'actor', 'enqueued_at', 'ix', 'timeline', 'progress', 'note', 'retry_at', 'due_at'
}
local records, order, counters = {}, {}, {}

-- A record as a Lua table: ``has`` its fields as the updates so far left them (false: absent),
-- ``set``/``del`` what to write at the end.
local function load(id)
  local r = records[id]
  if r then return r end
  local key = NS .. 'status:' .. id
  local values = redis.call('HMGET', key, unpack(LOADED))
  r = {key = key, id = id, ord = tonumber(values[1]) or -1, has = {}, set = {}, del = {}}
  for i, name in ipairs(LOADED) do r.has[name] = values[i] end
  records[id] = r
  order[#order + 1] = r
  return r
end

local function field(r, name)
  if r.has[name] == nil then r.has[name] = redis.call('HGET', r.key, name) end
  return r.has[name]
end

local function put(r, name, value)
  r.has[name], r.set[name], r.del[name] = value, value, nil
end

local function add_timeline(r, state, at, o, late)
  r.line = r.line or (r.has.timeline and cjson.decode(r.has.timeline) or {})
  if timeline(r.line, state, at, o % REPLAY_STRIDE, late) then r.line_changed = true end
end

local function count(queue, state)
  local key = NS .. 'status-counts:' .. queue
  local per_state = counters[key] or {}
  counters[key] = per_state
  per_state[state] = (per_state[state] or 0) + 1
end

local function apply(u)
  local r = load(u.m)
  local state = u.f.state
  if u.o < r.ord then
    if state then add_timeline(r, state, tonumber(u.f.updated_at) or NOW, u.o, true) end
    return
  end
  local previous = r.has.state
  r.ord = u.o
  put(r, 'ord', u.o)
  for name, value in pairs(u.f) do put(r, name, value) end
  for name, value in pairs(u.n) do
    if not field(r, name) then put(r, name, value) end
  end
  for _, name in ipairs(u.d) do
    if r.has[name] ~= false then r.has[name], r.set[name], r.del[name] = false, nil, true end
  end
  local due = tonumber(u.f.due_at)
  -- a scheduled record lives until its due time, and TTL after it
  r.ttl = (state == 'scheduled' and due) and TTL + math.max(0, due - NOW) or TTL
  if state and (state ~= previous or state == 'scheduled') then
    schedule(u.m, r.has.queue or '', previous, state, due)
  end
  if state and state ~= previous then
    local at = tonumber(u.f.updated_at) or NOW
    count(u.q, state)
    add_timeline(r, state, at, u.o, false)
    count_minute(r.has.queue or '', state, at)
    r.moved = true
  end
end

local function write(r)
  if r.moved then
    local state, ix = r.has.state, r.has.ix
    local score = tonumber(r.has.enqueued_at) or NOW
    index(r.id, state, r.has.queue or '', r.has.actor or '', score, ix)
    put(r, 'ix', state)
  end
  if r.line_changed then r.set.timeline = cjson.encode(r.line) end
  local args, dropped = {}, {}
  for name, value in pairs(r.set) do
    args[#args + 1] = name
    args[#args + 1] = value
  end
  for name in pairs(r.del) do dropped[#dropped + 1] = name end
  if #args > 0 then redis.call('HSET', r.key, unpack(args)) end
  if #dropped > 0 then redis.call('HDEL', r.key, unpack(dropped)) end
  if r.ttl then redis.call('PEXPIRE', r.key, r.ttl) end
end

for _, u in ipairs(cjson.decode(ARGV[4])) do apply(u) end
for _, r in ipairs(order) do write(r) end
for key, per_state in pairs(counters) do
  for state, n in pairs(per_state) do redis.call('HINCRBY', key, state, n) end
end
write_minutes()
write_index(TTL)
return 0
""".replace("REPLAY_STRIDE", str(REPLAY_STRIDE))
)
