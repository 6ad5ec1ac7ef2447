"""What the status writer keeps besides each job's current state: its timeline, and per-minute counts.

- **Timeline**: each accepted change of state is appended to the record's ``timeline`` field as
  ``[state, time ms, attempt, order within the replay]``; the first entry and the latest
  ``TIMELINE_MAX - 1`` are kept, so a job retried a hundred times keeps a bounded record. A
  state that arrives after a later one (the sender's ``queued`` written after the worker's
  ``running``) is not applied to the record but still goes into the timeline, before the later
  states.
- **Per-minute counts**: per queue, how many jobs entered each state in each minute, kept
  ``MINUTES_TTL_MS`` (the dashboard charts the last hour). Redis: one hash per queue and hour
  (``status-minutes:<queue>:<hour>``, fields ``<minute>:<state>``) that expires whole; SQLite:
  the table ``job_status_minutes``, swept once a minute.

Both are written in the same script call or transaction as the record (:mod:`jobsystem.store.status`).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Mapping
from string import Template
from typing import Any

from jobsystem.store.redis import RedisStore, reply_text

__all__ = [
    "HISTORY_LUA",
    "MINUTES_TTL_MS",
    "SQLITE_SCHEMA",
    "TIMELINE_MAX",
    "add_to_timeline",
    "redis_minutes",
    "sqlite_count_minutes",
]

#: Entries of a record's timeline: the first one and the latest ones.
TIMELINE_MAX = 50
#: How long per-minute counts are kept.
MINUTES_TTL_MS = 3 * 3_600_000

#: Inside the status script: ``timeline(line, state, at, order, late)`` adds one change to a decoded
#: timeline (returns whether it changed; the caller encodes and writes it once per record);
#: ``count_minute(queue, state, at)`` counts one change, and ``write_minutes()`` at the end sends the
#: sums (one HINCRBY per minute and state, one PEXPIRE per hash). ``NS`` (the store's namespace) and
#: ``text`` (a whole number as text, formatted once per call) are locals the script declares before it.
HISTORY_LUA = Template("""
local function timeline(line, state, at, order, late)
  local place = #line + 1
  if late then  -- an earlier state written after a later one (another process): put it in its place
    for i, e in ipairs(line) do
      if e[1] == state and e[4] == order then return false end
      if (e[4] or 0) > order and place > i then place = i end
    end
  end
  if #line >= $timeline_max then
    table.remove(line, 2)
    place = math.max(2, place - 1)
  end
  table.insert(line, place, {state, at, math.floor(order / 10), order})
  return true
end

local MINUTES = {}
local function count_minute(queue, state, at)
  local minute = math.floor(at / 60000)
  local per_hour = NS .. 'status-minutes:' .. queue .. ':' .. text(math.floor(minute / 60))
  local counts = MINUTES[per_hour] or {}
  MINUTES[per_hour] = counts
  local name = text(minute) .. ':' .. state
  counts[name] = (counts[name] or 0) + 1
end

local function write_minutes()
  for per_hour, counts in pairs(MINUTES) do
    for name, n in pairs(counts) do redis.call('HINCRBY', per_hour, name, n) end
    redis.call('PEXPIRE', per_hour, $minutes_ttl)
  end
end
""").substitute(timeline_max=TIMELINE_MAX, minutes_ttl=MINUTES_TTL_MS)

SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS job_status_minutes (
    queue TEXT NOT NULL,
    minute INTEGER NOT NULL,
    state TEXT NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (queue, minute, state)
) WITHOUT ROWID
"""


def add_to_timeline(entries: list[Any], state: str, at: int, order: int, *, late: bool = False) -> bool:
    """Add one change to a decoded timeline (SQLite's twin of the Lua ``timeline``). A ``late``
    one (an earlier state that another process wrote after a later one) goes before the later
    states, once. Returns whether the timeline changed."""
    place = len(entries)
    if late:
        if any(e[0] == state and e[3:] == [order] for e in entries):
            return False
        place = next((i for i, e in enumerate(entries) if (e[3:] or [0])[0] > order), place)
    if len(entries) >= TIMELINE_MAX:
        del entries[1]
        place = max(1, place - 1)
    entries.insert(place, [state, at, order // 10, order])
    return True


def sqlite_count_minutes(conn: sqlite3.Connection, counts: Mapping[tuple[str, str, int], int]) -> None:
    """Add ``counts`` (per namespaced queue, state and time in ms: how many changes) to the minutes."""
    conn.executemany(
        "INSERT INTO job_status_minutes (queue, minute, state, count) VALUES (?, ?, ?, ?) "
        "ON CONFLICT(queue, minute, state) DO UPDATE SET count = count + excluded.count",
        [(queue, minute, state, n) for (queue, state, minute), n in counts.items()],
    )


def sqlite_sweep_minutes(conn: sqlite3.Connection, now_ms: int) -> None:
    conn.execute("DELETE FROM job_status_minutes WHERE minute < ?", (now_ms - MINUTES_TTL_MS,))


def sqlite_minutes(
    conn: sqlite3.Connection, queue_keys: dict[str, str], since_ms: int
) -> dict[str, dict[int, dict[str, int]]]:
    """Per queue (``queue_keys`` maps each to its namespaced name), per minute since ``since_ms``."""
    found: dict[str, dict[int, dict[str, int]]] = {}
    for queue, queue_key in queue_keys.items():
        per_minute = found.setdefault(queue, {})
        for minute, state, count in conn.execute(
            "SELECT minute, state, count FROM job_status_minutes WHERE queue = ? AND minute >= ?",
            (queue_key, since_ms // 60_000 * 60_000),
        ):
            per_minute.setdefault(int(minute), {})[str(state)] = int(count)
    return found


def redis_minutes(
    store: RedisStore, queues: list[str], since_ms: int
) -> dict[str, dict[int, dict[str, int]]]:
    """Per queue, per minute (ms of its start) since ``since_ms``: jobs entering each state."""
    hours = range(since_ms // 3_600_000, int(time.time()) // 3_600 + 1)
    with store.errors():
        pipe = store.client.pipeline(transaction=False)
        for queue in queues:
            for hour in hours:
                pipe.hgetall(store.key(f"status-minutes:{queue}:{hour}"))
        replies = iter(pipe.execute())
    found: dict[str, dict[int, dict[str, int]]] = {}
    for queue in queues:
        per_minute = found.setdefault(queue, {})
        for _ in hours:
            for name, count in next(replies).items():
                minute, _, state = reply_text(name).partition(":")
                if int(minute) * 60_000 >= since_ms:
                    per_minute.setdefault(int(minute) * 60_000, {})[state] = int(count)
    return found
