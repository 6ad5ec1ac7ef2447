"""The job index: every status record listed newest first by queue, actor and state.

Written by the status writer (:mod:`jobsystem.store.status`) in the same script call or
transaction as the record, so the index and the records never disagree about a job's state;
read by the dashboard's job list, which must stay fast with a million records, so no read scans.

- Redis: sorted sets scored by the job's send time (``enqueued_at``), one per filter value and
  per combination the dashboard asks for: ``jobs:all``, ``jobs:q:<queue>``, ``jobs:a:<actor>``,
  ``jobs:s:<state>``, ``jobs:qs:<queue>|<state>``, ``jobs:as:<actor>|<state>``. A change of state
  moves the id between the state sets; the record's field ``ix`` says under which state it is
  filed. An entry is taken out when its record expires (``jobs:until``, see :data:`INDEX_LUA`),
  however long ago its job was sent: a job delayed past the TTL stays listed while its record
  lives.
- SQLite: the table ``job_index`` with one index per filter combination.

A filter with both queue and actor walks the actor's set and keeps the ids also in the queue's.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

from jobsystem.store.redis import RedisStore
from jobsystem.store.sorted_index import Cursor, Walk, redis_walk
from jobsystem.store.sqlite import SqliteStore

__all__ = [
    "INDEX_LUA",
    "SQLITE_SCHEMA",
    "JobFilter",
    "redis_page",
    "redis_total",
    "sqlite_file",
    "sqlite_page",
    "sqlite_total",
]

#: Index maintenance inside the status script: ``index(id, state, queue, actor, score, ix)`` files a
#: record under ``state`` (taking it out of the sets of ``ix``, the state it was filed under, if
#: any; the caller then stores ``ix = state``), once per record and script call, with the record's
#: final state. ``keep(id, state, queue, actor, sent, expires_at, expires_text)`` says until when a
#: filed record lives (for each record the call writes, after ``index``; the time also as text:
#: Redis formats a number handed to a command at a cost above a member's ZADD). ``write_index(ttl)``
#: at the end sends the moves, one ZREM and one ZADD per set and up to ``INDEX_CHUNK`` arguments
#: (even: ZADD takes score-member pairs; a call from Lua costs more than a member added), removals
#: first, and takes out the entries whose records expired. ``NS`` (the store's namespace) and
#: ``NOW`` (ms) are locals the script declares before it.
#:
#: An entry leaves the sets when its record expires, whenever it was sent: ``jobs:until`` scores
#: ``<state>|<queue>|<actor>|<id>`` (the sets an entry is in; a queue's name holds no ``|``, nor does
#: an actor's of the project's shape: an entry of one that does is left to the trim by send time)
#: by its record's expiry, and each call takes out up to ``TRIM_MAX`` entries past it.
#: ``jobs:reach`` is the longest life (expiry - send time) of an entry filed so far, at least the
#: TTL: a set written is also trimmed of the entries sent longer ago than that (the previous
#: release's entries, which ``jobs:until`` does not know), and expires whole when nobody writes it
#: for that long.
INDEX_LUA = """
local ADDS, REMOVES, KEPT, UNKEPT, REACH = {}, {}, {}, {}, 0
local UNTIL, REACH_KEY = NS .. 'jobs:until', NS .. 'jobs:reach'

local function file_in(set, score, id)
  local members = ADDS[set] or {}
  ADDS[set] = members
  members[#members + 1] = score
  members[#members + 1] = id
end

local function take_from(set, id)
  local members = REMOVES[set] or {}
  REMOVES[set] = members
  members[#members + 1] = id
end

local function index(id, state, q, a, score, ix)
  if not ix then
    file_in(NS .. 'jobs:all', score, id)
    file_in(NS .. 'jobs:q:' .. q, score, id)
    file_in(NS .. 'jobs:a:' .. a, score, id)
  else
    take_from(NS .. 'jobs:s:' .. ix, id)
    take_from(NS .. 'jobs:qs:' .. q .. '|' .. ix, id)
    take_from(NS .. 'jobs:as:' .. a .. '|' .. ix, id)
    UNKEPT[#UNKEPT + 1] = ix .. '|' .. q .. '|' .. a .. '|' .. id
  end
  file_in(NS .. 'jobs:s:' .. state, score, id)
  file_in(NS .. 'jobs:qs:' .. q .. '|' .. state, score, id)
  file_in(NS .. 'jobs:as:' .. a .. '|' .. state, score, id)
end

local function keep(id, state, q, a, sent, expires_at, expires_text)
  KEPT[#KEPT + 1] = expires_text
  KEPT[#KEPT + 1] = state .. '|' .. q .. '|' .. a .. '|' .. id
  local life = expires_at - math.min(sent or NOW, NOW)
  if life > REACH then REACH = life end
end

local function in_chunks(command, set, members)
  for i = 1, #members, INDEX_CHUNK do
    redis.call(command, set, unpack(members, i, math.min(#members, i + INDEX_CHUNK - 1)))
  end
end

-- The entries whose records expired, out of their sets (queued in REMOVES) and of jobs:until (the
-- lowest ranks). The six sets' names are made once per queue, actor and state.
local function expire_entries()
  local gone, sets_of = redis.call('ZRANGEBYSCORE', UNTIL, '-inf', NOW, 'LIMIT', 0, TRIM_MAX), {}
  for _, entry in ipairs(gone) do
    local p1 = string.find(entry, '|', 1, true)
    local p2 = p1 and string.find(entry, '|', p1 + 1, true)
    local p3 = p2 and string.find(entry, '|', p2 + 1, true)
    if p3 then
      local prefix, id = string.sub(entry, 1, p3), string.sub(entry, p3 + 1)
      local sets = sets_of[prefix]
      if not sets then
        local state, q = string.sub(entry, 1, p1 - 1), string.sub(entry, p1 + 1, p2 - 1)
        local a = string.sub(entry, p2 + 1, p3 - 1)
        sets = {
          NS .. 'jobs:all', NS .. 'jobs:q:' .. q, NS .. 'jobs:a:' .. a, NS .. 'jobs:s:' .. state,
          NS .. 'jobs:qs:' .. q .. '|' .. state, NS .. 'jobs:as:' .. a .. '|' .. state
        }
        sets_of[prefix] = sets
      end
      for i = 1, 6 do take_from(sets[i], id) end
    end
  end
  if #gone > 0 then redis.call('ZREMRANGEBYRANK', UNTIL, 0, #gone - 1) end
end

local function write_index(ttl)
  local reach = math.max(ttl, tonumber(redis.call('GET', REACH_KEY)) or 0)
  if REACH > reach then
    reach = REACH
    redis.call('SET', REACH_KEY, string.format('%d', reach))
  end
  in_chunks('ZREM', UNTIL, UNKEPT)
  if #KEPT > 0 then
    in_chunks('ZADD', UNTIL, KEPT)
    redis.call('PEXPIRE', UNTIL, reach)
  end
  expire_entries()
  for set, members in pairs(REMOVES) do in_chunks('ZREM', set, members) end
  for set, members in pairs(ADDS) do
    in_chunks('ZADD', set, members)
    redis.call('ZREMRANGEBYSCORE', set, '-inf', '(' .. (NOW - reach))
    redis.call('PEXPIRE', set, reach)
  end
end
""".replace("INDEX_CHUNK", "1000").replace("TRIM_MAX", "2000")


@dataclass(frozen=True)
class JobFilter:
    """Which jobs a listing shows; empty fields match every job."""

    queue: str | None = None
    actor: str | None = None
    state: str | None = None

    def redis_sets(self, namespace: str) -> tuple[str, list[str]]:
        """The set to walk and the sets its members must also be in."""
        base = namespace + "jobs:"
        if self.actor:
            primary = f"{base}as:{self.actor}|{self.state}" if self.state else f"{base}a:{self.actor}"
            return primary, [f"{base}q:{self.queue}"] if self.queue else []
        if self.queue:
            return (f"{base}qs:{self.queue}|{self.state}" if self.state else f"{base}q:{self.queue}"), []
        return (f"{base}s:{self.state}" if self.state else f"{base}all"), []


def redis_page(store: RedisStore, job_filter: JobFilter, cursor: Cursor | None, limit: int) -> Walk:
    """A page of message ids matching ``job_filter``, newest first."""
    primary, verify = job_filter.redis_sets(store.namespace)
    return redis_walk(store, primary, verify, cursor, limit)


def redis_total(store: RedisStore, job_filter: JobFilter) -> tuple[int, bool]:
    """How many jobs match (exact unless a second set narrows the walked one)."""
    primary, verify = job_filter.redis_sets(store.namespace)
    with store.errors():
        return int(store.client.zcard(primary)), not verify


SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS job_index (
    id INTEGER PRIMARY KEY,
    key TEXT NOT NULL UNIQUE,
    ns TEXT NOT NULL,
    queue TEXT NOT NULL,
    actor TEXT NOT NULL,
    state TEXT NOT NULL,
    enqueued_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS job_index_all ON job_index (ns, enqueued_at);
CREATE INDEX IF NOT EXISTS job_index_q ON job_index (queue, enqueued_at);
CREATE INDEX IF NOT EXISTS job_index_a ON job_index (actor, enqueued_at);
CREATE INDEX IF NOT EXISTS job_index_s ON job_index (ns, state, enqueued_at);
CREATE INDEX IF NOT EXISTS job_index_qs ON job_index (queue, state, enqueued_at);
CREATE INDEX IF NOT EXISTS job_index_as ON job_index (actor, state, enqueued_at);
CREATE INDEX IF NOT EXISTS job_index_expires ON job_index (expires_at)
"""


def sqlite_file(
    conn: sqlite3.Connection, store: SqliteStore, message_id: str, fields: dict[str, Any], expires_at: int
) -> None:
    """File (or move) a record under its current state; called inside the status transaction."""
    conn.execute(
        "INSERT INTO job_index (key, ns, queue, actor, state, enqueued_at, expires_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(key) DO UPDATE SET state = excluded.state, "
        "expires_at = excluded.expires_at",
        (
            store.key(message_id),
            store.namespace,
            fields.get("queue") or "",
            fields.get("actor") or "",
            fields.get("state") or "queued",
            int(fields.get("enqueued_at") or fields.get("updated_at") or 0),
            expires_at,
        ),
    )


def _where(store: SqliteStore, job_filter: JobFilter) -> tuple[list[str], list[Any]]:
    clauses, params = ["ns = ?"], [store.namespace]
    for column in ("queue", "actor", "state"):
        value = getattr(job_filter, column)
        if value:
            clauses.append(f"{column} = ?")
            params.append(value)
    return clauses, params


def sqlite_page(store: SqliteStore, job_filter: JobFilter, cursor: Cursor | None, limit: int) -> Walk:
    """A page of message ids matching ``job_filter``, newest first."""
    clauses, params = _where(store, job_filter)
    if cursor is not None:
        clauses.append("(enqueued_at, id) < (?, ?)")
        params += [cursor.at, cursor.seq]
    sql = (
        f"SELECT key, enqueued_at, id FROM job_index WHERE {' AND '.join(clauses)} "
        "ORDER BY enqueued_at DESC, id DESC LIMIT ?"
    )
    rows = store.rows(sql, (*params, limit + 1))
    entries = [(str(key)[len(store.namespace) :], int(at)) for key, at, _ in rows[:limit]]
    more = len(rows) > limit
    last = rows[limit - 1] if more else None
    return Walk(entries, Cursor(int(last[1]), str(last[2])) if last else None)


def sqlite_total(store: SqliteStore, job_filter: JobFilter, cap: int = 10_000) -> tuple[int, bool]:
    """How many jobs match, counted up to ``cap`` (exact when below it)."""
    clauses, params = _where(store, job_filter)
    sql = f"SELECT COUNT(*) FROM (SELECT 1 FROM job_index WHERE {' AND '.join(clauses)} LIMIT ?)"
    ((count,),) = store.rows(sql, (*params, cap + 1))
    return min(int(count), cap), int(count) <= cap
