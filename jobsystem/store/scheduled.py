"""The scheduled index: per queue, the jobs waiting in RabbitMQ's delay cascade, by due time.

RabbitMQ cannot say how many messages of one queue wait in the cascade (its level queues are
shared by every queue of an environment), so the status writer (:mod:`jobsystem.store.status`)
files a job here, in the same script call or transaction as its record, when its state becomes
``scheduled``, and takes it out when the state changes again (it left the cascade, or runs).
``jobctl health`` and the metrics read the count and the next due time per queue, and health
how many are due soon (within ``soon_ms`` of now, either side: an entry due long ago is a job that
left the cascade, or one whose message was purged or lost, kept until the records' TTL).

- Redis: one sorted set per queue, ``scheduled:<queue>``, scored by the due time (ms), members
  message ids. Entries due longer ago than the records' TTL (a message purged or lost while it
  waited) are trimmed whenever the set is written.
- SQLite: the table ``scheduled_jobs`` indexed by (queue, due time).

Key names hold queue names and message ids only: no job data.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from jobsystem.store.redis import RedisStore
from jobsystem.store.sqlite import SqliteStore

__all__ = [
    "SCHEDULED_LUA",
    "SQLITE_SCHEMA",
    "Scheduled",
    "redis_scheduled",
    "sqlite_file",
    "sqlite_scheduled",
]


@dataclass(frozen=True)
class Scheduled:
    """How many jobs of a queue wait in the cascade, when the next one is due (ms; None: none),
    and how many of them are due within ``soon_ms`` of now, either side (0 when not asked)."""

    count: int
    next_due_at: int | None
    soon: int = 0


#: ``schedule(id, queue, previous, state, due)`` after a record's state changed; ``TTL``, ``NS``
#: and ``NOW`` are locals the status script declares before it.
SCHEDULED_LUA = """
local function schedule(id, queue, previous, state, due)
  local set = NS .. 'scheduled:' .. queue
  if state == 'scheduled' and due then
    redis.call('ZADD', set, due, id)
    redis.call('ZREMRANGEBYSCORE', set, '-inf', NOW - TTL)
  elseif previous == 'scheduled' then
    redis.call('ZREM', set, id)
  end
end
"""


def _key(store: RedisStore, queue: str) -> str:
    return store.key("scheduled:" + queue)


def redis_scheduled(store: RedisStore, queues: list[str], soon_ms: int = 0) -> dict[str, Scheduled]:
    """The count, next due time and count due soon of each of ``queues``, in one round trip
    (and one for the store's clock when ``soon_ms`` is asked)."""
    now = store.now_ms() if soon_ms else 0
    with store.errors():
        pipe = store.client.pipeline(transaction=False)
        for queue in queues:
            pipe.zcard(_key(store, queue))
            pipe.zrange(_key(store, queue), 0, 0, withscores=True)
            if soon_ms:
                pipe.zcount(_key(store, queue), now - soon_ms, now + soon_ms)
        replies = pipe.execute()
    per_queue = 3 if soon_ms else 2
    found = {}
    for i, queue in enumerate(queues):
        count, first, *soon = replies[per_queue * i : per_queue * (i + 1)]
        found[queue] = Scheduled(int(count), int(first[0][1]) if first else None, int(soon[0]) if soon else 0)
    return found


SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS scheduled_jobs (
    queue TEXT NOT NULL,
    message_id TEXT NOT NULL,
    due_at INTEGER NOT NULL,
    PRIMARY KEY (queue, message_id)
);
CREATE INDEX IF NOT EXISTS scheduled_jobs_due ON scheduled_jobs (queue, due_at)
"""


def sqlite_file(
    conn: sqlite3.Connection,
    queue_key: str,
    message_id: str,
    previous: str | None,
    state: str,
    due_at: str | None,
    ttl_ms: int,
    now: int,
) -> None:
    """File or unfile one job after its state changed (``queue_key``: the namespaced queue)."""
    if state == "scheduled" and due_at:
        conn.execute(
            "INSERT INTO scheduled_jobs (queue, message_id, due_at) VALUES (?, ?, ?) "
            "ON CONFLICT(queue, message_id) DO UPDATE SET due_at = excluded.due_at",
            (queue_key, message_id, int(due_at)),
        )
        conn.execute("DELETE FROM scheduled_jobs WHERE queue = ? AND due_at < ?", (queue_key, now - ttl_ms))
    elif previous == "scheduled":
        conn.execute("DELETE FROM scheduled_jobs WHERE queue = ? AND message_id = ?", (queue_key, message_id))


def sqlite_scheduled(store: SqliteStore, queues: list[str], soon_ms: int = 0) -> dict[str, Scheduled]:
    """The count, next due time and count due soon of each of ``queues``."""
    now, found = store.now_ms(), {}
    for queue in queues:
        ((count, first, soon),) = store.rows(
            "SELECT COUNT(*), MIN(due_at), COUNT(CASE WHEN due_at BETWEEN ? AND ? THEN 1 END) "
            "FROM scheduled_jobs WHERE queue = ?",
            (now - soon_ms, now + soon_ms, store.key(queue)),
        )
        found[queue] = Scheduled(
            int(count), int(first) if first is not None else None, int(soon) if soon_ms else 0
        )
    return found
