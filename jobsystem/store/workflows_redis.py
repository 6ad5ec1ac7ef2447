"""Workflows on Redis: the operations of :mod:`jobsystem.store.workflows` as Lua scripts on the
hash ``wf:<id>`` and the sets ``wf:<id>:done:<i>`` (the fields are described there), each one atomic
call."""

from __future__ import annotations

import json
from typing import Any

from jobsystem.store.base import StoreUnavailable
from jobsystem.store.cancel_marks import IN_WORKFLOWS, mark_name, pair_mark_name
from jobsystem.store.redis import RedisStore, reply_text
from jobsystem.store.workflows import (
    StepProgress,
    WorkflowBackend,
    WorkflowRecord,
    initial_fields,
    parse_fields,
)

__all__ = ["RedisWorkflows"]

_FINISH = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {'unknown', 0, 0, 0, '{}', 0, 0} end
local step, member, state = ARGV[1], ARGV[2], ARGV[3]
-- Cancelled while it ran, and returned before the mark could interrupt it: counted as cancelled.
-- Marked by id, or as this workflow's member; not by a pair of another workflow ('w' alone).
if state == 'succeeded' then
  local held = redis.call('GET', KEYS[3])
  if (held and held ~= ARGV[7]) or redis.call('EXISTS', KEYS[4]) == 1 then state = 'cancelled' end
end
local added = redis.call('SADD', KEYS[2], member)
if added == 1 then
  redis.call('HSET', KEYS[1], 's:' .. member, state, 'r:' .. member, ARGV[4])
  if ARGV[6] ~= '' then redis.call('HSET', KEYS[1], 'e:' .. member, ARGV[6]) end
  redis.call('HINCRBY', KEYS[1], 'c:' .. step .. ':' .. state, 1)
  if state ~= 'succeeded' and redis.call('HGET', KEYS[1], 'mode:' .. step) ~= 'finished'
      and redis.call('HGET', KEYS[1], 'state') == 'running' then
    redis.call('HSET', KEYS[1], 'state', 'failed', 'failed', member)
  end
elseif state == 'succeeded' and ARGV[8] == '1' and redis.call('HGET', KEYS[1], 's:' .. member) == 'dead' then
  -- Replayed from the dead letters and succeeded: counted again, as succeeded. A workflow it
  -- failed runs on once no member of its step is left unsucceeded; it hands the step on.
  redis.call('HSET', KEYS[1], 's:' .. member, 'succeeded', 'r:' .. member, ARGV[4])
  redis.call('HINCRBY', KEYS[1], 'c:' .. step .. ':dead', -1)
  redis.call('HINCRBY', KEYS[1], 'c:' .. step .. ':succeeded', 1)
  if redis.call('HGET', KEYS[1], 'state') == 'failed' and redis.call('HGET', KEYS[1], 'failed') == member then
    local other = false
    for _, m in ipairs(redis.call('SMEMBERS', KEYS[2])) do
      if redis.call('HGET', KEYS[1], 's:' .. m) ~= 'succeeded' then other = m break end
    end
    if other then
      redis.call('HSET', KEYS[1], 'failed', other)
    else
      redis.call('HSET', KEYS[1], 'state', 'running')
      redis.call('HDEL', KEYS[1], 'failed')
      if redis.call('SCARD', KEYS[2]) >= tonumber(redis.call('HGET', KEYS[1], 'size:' .. step)) then
        redis.call('HSET', KEYS[1], 'by:' .. step, member)
      end
    end
  end
end
-- Never shortened: a sibling delayed past the TTL (or a delayed next step) still finds them.
redis.call('PEXPIRE', KEYS[1], ARGV[5], 'GT')
redis.call('PEXPIRE', KEYS[2], math.max(tonumber(ARGV[5]), redis.call('PTTL', KEYS[1])))
local n = redis.call('SCARD', KEYS[2])
local size = tonumber(redis.call('HGET', KEYS[1], 'size:' .. step))
if added == 1 and n >= size then redis.call('HSETNX', KEYS[1], 'by:' .. step, member) end
local by = redis.call('HGET', KEYS[1], 'by:' .. step)
local completer = (n >= size and (not by or by == member)) and 1 or 0
local last = tonumber(redis.call('HGET', KEYS[1], 'steps')) - 1
if n >= size and tonumber(step) == last and redis.call('HGET', KEYS[1], 'state') == 'running' then
  redis.call('HSET', KEYS[1], 'state', 'succeeded')
end
local counts = {}
for _, s in ipairs({'succeeded', 'dead', 'cancelled'}) do
  counts[s] = tonumber(redis.call('HGET', KEYS[1], 'c:' .. step .. ':' .. s) or '0')
end
local sent = redis.call('HGET', KEYS[1], 'sent:' .. step) and 1 or 0
return {redis.call('HGET', KEYS[1], 'state'), added, n, size, cjson.encode(counts), sent, completer}
"""

# Only a new workflow: a relaunch (its id derived from its launch) finds the first one's counts.
_CREATE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
"""

_SET_STATE = """
if redis.call('HGET', KEYS[1], 'state') == ARGV[2] then
  redis.call('HSET', KEYS[1], 'state', ARGV[1])
  return 1
end
return 0
"""

_FAIL_MEMBER = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local step, member = ARGV[1], ARGV[2]
local was = redis.call('HGET', KEYS[1], 's:' .. member)
if was ~= 'failed' then
  if was then redis.call('HINCRBY', KEYS[1], 'c:' .. step .. ':' .. was, -1) end
  redis.call('HINCRBY', KEYS[1], 'c:' .. step .. ':failed', 1)
end
redis.call('HSET', KEYS[1], 's:' .. member, 'failed', 'e:' .. member, ARGV[3])
if redis.call('HGET', KEYS[1], 'state') == 'running' then
  redis.call('HSET', KEYS[1], 'state', 'failed', 'failed', member)
end
redis.call('PEXPIRE', KEYS[1], ARGV[4], 'GT')
return 1
"""

# Only a workflow still recorded (see _MARK_SENT); a step's set of finished members may not exist yet.
_KEEP = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[1], 'GT')
redis.call('PEXPIRE', KEYS[2], ARGV[1], 'GT')
return 1
"""

# Only a workflow still recorded: an expired one's hash would be made anew, with no expiry to end
# it (``PEXPIRE ... GT`` leaves a key without a TTL as it is).
_MARK_SENT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'sent:' .. ARGV[1], '1')
redis.call('PEXPIRE', KEYS[1], ARGV[2], 'GT')
return 1
"""


# KEYS: the marks of the ARGV[1] ids, then per (member, workflow) pair asked about its workflow and
# its pair's mark, the pair's member in ARGV[j + 2] for the j-th pair: each pair answered for its
# own workflow. An id's mark held for pairs only (ARGV[2]) is no mark by id.
_CANCELLED_AMONG = """
local n = tonumber(ARGV[1])
local found = {}
for i = 1, n do
  local held = redis.call('GET', KEYS[i])
  found[i] = (held and held ~= ARGV[2]) and 1 or 0
end
for j = 1, (#KEYS - n) / 2 do
  local workflow, pair = KEYS[n + 2 * j - 1], KEYS[n + 2 * j]
  local fields = redis.call('HMGET', workflow, 'state', 's:' .. ARGV[j + 2])
  local ended = fields[2]
  local stopped = fields[1] == 'cancelled' and (not ended or ended == 'cancelled')
  found[n + j] = (stopped or redis.call('EXISTS', pair) == 1) and 1 or 0
end
return found
"""


class RedisWorkflows(WorkflowBackend):
    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self._create = store.script(_CREATE)
        self._finish = store.script(_FINISH)
        self._set_state = store.script(_SET_STATE)
        self._mark_sent = store.script(_MARK_SENT)
        self._fail_member = store.script(_FAIL_MEMBER)
        self._keep = store.script(_KEEP)
        self._cancelled_among = store.script(_CANCELLED_AMONG)

    def _key(self, workflow_id: str) -> str:
        return self.store.key(f"wf:{workflow_id}")

    def create(self, record: dict[str, Any], ttl_ms: int) -> bool:
        pairs = [text for item in initial_fields(record).items() for text in item]
        return bool(self._create(keys=[self._key(record["id"])], args=[ttl_ms, *pairs]))

    def finish(
        self,
        workflow_id: str,
        step: int,
        member: str,
        state: str,
        result: str,
        ttl_ms: int,
        reason: str = "",
        *,
        replayed: bool = False,
    ) -> StepProgress:
        key = self._key(workflow_id)
        reply = self._finish(
            keys=[
                key,
                f"{key}:done:{step}",
                self.store.key(mark_name(member)),
                self.store.key(pair_mark_name(member, workflow_id)),
            ],
            args=[step, member, state, result, ttl_ms, reason, IN_WORKFLOWS, "1" if replayed else ""],
        )
        try:
            wf_state, added, finished, size, counts, sent, completer = reply
            return StepProgress(
                reply_text(wf_state),
                bool(added),
                int(finished),
                int(size),
                json.loads(reply_text(counts)),
                bool(sent),
                bool(completer),
            )
        except (TypeError, ValueError) as exc:  # a reply of the wrong shape
            raise StoreUnavailable(f"unexpected reply to finish: {exc}") from exc

    def fail_member(self, workflow_id: str, step: int, member: str, reason: str, ttl_ms: int) -> None:
        self._fail_member(keys=[self._key(workflow_id)], args=[step, member, reason, ttl_ms])

    def keep(self, workflow_id: str, step: int, ttl_ms: int) -> None:
        key = self._key(workflow_id)
        self._keep(keys=[key, f"{key}:done:{step}"], args=[ttl_ms])

    def mark_sent(self, workflow_id: str, step: int, ttl_ms: int) -> None:
        # The TTL grows to cover the next step's delay; never shortened.
        self._mark_sent(keys=[self._key(workflow_id)], args=[step, ttl_ms])

    def get(self, workflow_id: str) -> WorkflowRecord | None:
        with self.store.errors():
            raw = self.store.client.hgetall(self._key(workflow_id))
        return parse_fields({reply_text(k): reply_text(v) for k, v in raw.items()})

    def set_state(self, workflow_id: str, state: str, *, only_from: str = "running") -> bool:
        return bool(self._set_state(keys=[self._key(workflow_id)], args=[state, only_from]))

    def _cancelled(
        self, ids: list[str], pairs: list[tuple[str, str]]
    ) -> tuple[set[str], set[tuple[str, str]]]:
        keys = [self.store.key(mark_name(i)) for i in ids]
        for member, workflow_id in pairs:
            keys += [self._key(workflow_id), self.store.key(pair_mark_name(member, workflow_id))]
        reply = self._cancelled_among(keys=keys, args=[len(ids), IN_WORKFLOWS, *(m for m, _ in pairs)])
        if not isinstance(reply, list) or len(reply) != len(ids) + len(pairs):  # of the wrong shape
            raise StoreUnavailable("unexpected reply to cancelled_among")
        marked = {i for i, found in zip(ids, reply[: len(ids)], strict=True) if found}
        return marked, {p for p, found in zip(pairs, reply[len(ids) :], strict=True) if found}
