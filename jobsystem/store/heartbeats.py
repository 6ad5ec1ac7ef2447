"""Worker heartbeats in the state store: which worker processes live, and what each is doing.

Each worker process writes its record (host, pid, queues, threads, busy threads, jobs done,
started at, version) every few seconds; the dashboard lists them. A record is kept
``KEEP_MS`` after its last beat, so a worker that stopped beating is shown gone for a while
before it disappears; one that stopped cleanly says so (``stopped_at``).

Redis: the records in one hash ``workers`` and their last beats in the sorted set
``workers:beats`` (listing costs two commands, no key scan), both expiring ``KEEP_MS`` after the
last beat of any worker: once every worker of a prefix is gone (killed, or the prefix a test's),
nothing of it stays. SQLite: the table ``workers``.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import Any

from jobsystem.store.base import Backends, StateStore
from jobsystem.store.redis import RedisStore
from jobsystem.store.sqlite import SqliteStore

__all__ = ["KEEP_MS", "HeartbeatBackend", "heartbeat_backend"]

#: How long a worker's record is kept after its last beat.
KEEP_MS = 3_600_000


class HeartbeatBackend(ABC):
    """The heartbeat operations, one implementation per store backend."""

    @abstractmethod
    def beat(self, worker_id: str, record: dict[str, Any], now_ms: int) -> None:
        """Write ``record`` as worker ``worker_id``'s latest, beaten at ``now_ms``."""

    @abstractmethod
    def workers(self, now_ms: int) -> list[dict[str, Any]]:
        """Every record beaten within ``KEEP_MS``, each with ``last_beat`` (ms), newest first."""


class RedisHeartbeats(HeartbeatBackend):
    def __init__(self, store: RedisStore) -> None:
        self.store = store

    def beat(self, worker_id: str, record: dict[str, Any], now_ms: int) -> None:
        records, beats = self.store.key("workers"), self.store.key("workers:beats")
        with self.store.errors():
            gone = self.store.client.zrangebyscore(beats, "-inf", now_ms - KEEP_MS)
            pipe = self.store.client.pipeline(transaction=True)
            pipe.hset(records, worker_id, json.dumps(record))
            pipe.zadd(beats, {worker_id: now_ms})
            if gone:
                pipe.hdel(records, *gone)
                pipe.zrem(beats, *gone)
            pipe.pexpire(records, KEEP_MS)
            pipe.pexpire(beats, KEEP_MS)
            pipe.execute()

    def workers(self, now_ms: int) -> list[dict[str, Any]]:
        records, beats = self.store.key("workers"), self.store.key("workers:beats")
        with self.store.errors():
            live: list[Any] = self.store.client.zrevrangebyscore(
                beats, "+inf", now_ms - KEEP_MS, withscores=True
            )
            raw = self.store.client.hmget(records, [pair[0] for pair in live]) if live else []
        return [
            {**json.loads(value), "last_beat": int(pair[1])}
            for pair, value in zip(live, raw, strict=True)
            if value is not None
        ]


_SCHEMA = """
CREATE TABLE IF NOT EXISTS workers (
    ns TEXT NOT NULL,
    id TEXT NOT NULL,
    record TEXT NOT NULL,
    beat_at INTEGER NOT NULL,
    PRIMARY KEY (ns, id)
)
"""


class SqliteHeartbeats(HeartbeatBackend):
    def __init__(self, store: SqliteStore) -> None:
        self.store = store
        store.ensure_schema(_SCHEMA)

    def beat(self, worker_id: str, record: dict[str, Any], now_ms: int) -> None:
        with self.store.transaction() as conn:
            conn.execute(
                "INSERT INTO workers (ns, id, record, beat_at) VALUES (?, ?, ?, ?) ON CONFLICT(ns, id) "
                "DO UPDATE SET record = excluded.record, beat_at = excluded.beat_at",
                (self.store.namespace, worker_id, json.dumps(record), now_ms),
            )
            conn.execute("DELETE FROM workers WHERE beat_at < ?", (now_ms - KEEP_MS,))

    def workers(self, now_ms: int) -> list[dict[str, Any]]:
        rows = self.store.rows(
            "SELECT record, beat_at FROM workers WHERE ns = ? AND beat_at >= ? ORDER BY beat_at DESC",
            (self.store.namespace, now_ms - KEEP_MS),
        )
        return [{**json.loads(record), "last_beat": int(beat)} for record, beat in rows]


def heartbeat_backend(store: StateStore) -> HeartbeatBackend:
    """The heartbeat operations for ``store``'s backend."""
    return store.operations(Backends(redis=RedisHeartbeats, sqlite=SqliteHeartbeats))
