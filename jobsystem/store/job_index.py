"""The job index: every status record listed newest first by queue, actor and state.

Written by the status writer (:mod:`jobsystem.store.status`) in the same script call or
transaction as the record, so the index and the records never disagree about a job's state;
read by the dashboard's job list, which must stay fast with a million records, so no read scans.

- Redis: sorted sets scored by the job's send time (``enqueued_at``), one per filter value and
  per combination the dashboard asks for: ``jobs:all``, ``jobs:q:<queue>``, ``jobs:a:<actor>``,
  ``jobs:s:<state>``, ``jobs:qs:<queue>|<state>``, ``jobs:as:<actor>|<state>``. A change of state
  moves the id between the state sets; the record's field ``ix`` says under which state it is
  filed. Entries sent longer ago than the records' TTL are trimmed whenever a set is written,
  and a set nobody writes expires whole.
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
#: final state. ``write_index(ttl)`` at the end sends the moves, one ZREM and one ZADD per set and
#: up to ``INDEX_CHUNK`` arguments (even: ZADD takes score-member pairs; a call from Lua costs more
#: than a member added), removals first, then trims the sets written. ``NS`` (the store's
#: namespace) and ``NOW`` (ms) are locals the script declares before it.
INDEX_LUA = """
local ADDS, REMOVES = {}, {}

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
  end
  file_in(NS .. 'jobs:s:' .. state, score, id)
  file_in(NS .. 'jobs:qs:' .. q .. '|' .. state, score, id)
  file_in(NS .. 'jobs:as:' .. a .. '|' .. state, score, id)
end

local function in_chunks(command, set, members)
  for i = 1, #members, INDEX_CHUNK do
    redis.call(command, set, unpack(members, i, math.min(#members, i + INDEX_CHUNK - 1)))
  end
end

local function write_index(ttl)
  for set, members in pairs(REMOVES) do in_chunks('ZREM', set, members) end
  for set, members in pairs(ADDS) do
    in_chunks('ZADD', set, members)
    redis.call('ZREMRANGEBYSCORE', set, '-inf', '(' .. (NOW - ttl))
    redis.call('PEXPIRE', set, ttl)
  end
end
""".replace("INDEX_CHUNK", "1000")


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
