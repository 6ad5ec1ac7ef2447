"""Cancellation marks in the state store: which message ids were cancelled, and when.

A mark lives ``ttl_ms`` (``CANCEL_TTL_MS``), so it outlives a worker restart and reaches every
host. Redis: the key ``cancel:<id>`` for the exact check and the sorted set ``cancels`` (id by
the store time it was marked) for the workers' pollers, pruned as marks are added. SQLite: the
table ``cancel_marks``. Message ids are UUIDs: no personal data in a key name.
"""

from __future__ import annotations

import sqlite3
from abc import ABC, abstractmethod

from jobsystem.store.base import Backends, StateStore, StoreUnavailable
from jobsystem.store.redis import RedisStore, reply_text
from jobsystem.store.sqlite import SqliteStore

__all__ = ["CancelMarks", "cancel_marks", "mark_name", "sqlite_marked"]


def mark_name(message_id: str) -> str:
    """The key of ``message_id``'s mark on Redis (in the store's namespace); the workflows' count
    reads it in its own script (:mod:`jobsystem.store.workflows`)."""
    return f"cancel:{message_id}"


def sqlite_marked(conn: sqlite3.Connection, store: SqliteStore, message_id: str) -> bool:
    """Whether ``message_id`` carries a mark, read in the caller's SQLite transaction."""
    row = conn.execute(
        "SELECT 1 FROM cancel_marks WHERE id = ? AND expires_at > ?", (store.key(message_id), store.now_ms())
    ).fetchone()
    return row is not None


class CancelMarks(ABC):
    """The cancellation marks' operations, one implementation per store backend."""

    @abstractmethod
    def mark_cancelled(self, ids: list[str], ttl_ms: int) -> None:
        """Mark message ids cancelled for ``ttl_ms``."""

    @abstractmethod
    def cancelled_among(self, ids: list[str]) -> set[str]:
        """Which of ``ids`` carry a cancellation mark (one round trip)."""

    @abstractmethod
    def cancelled_since(self, since_ms: int) -> tuple[dict[str, int], int]:
        """The ids marked at or after ``since_ms`` (store clock) with when, and the store's time
        now (one round trip): what a worker's poller adds to what it knows."""


_MARK = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
  if i > 1 then
    redis.call('SET', key, '1', 'PX', ttl)
    redis.call('ZADD', KEYS[1], now, ARGV[i])
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - ttl)
redis.call('PEXPIRE', KEYS[1], ttl)
return now
"""

_SINCE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {now, redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[1], '+inf', 'WITHSCORES')}
"""


class RedisCancelMarks(CancelMarks):
    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self._mark = store.script(_MARK)
        self._since = store.script(_SINCE)

    def mark_cancelled(self, ids: list[str], ttl_ms: int) -> None:
        if ids:
            keys = [self.store.key("cancels"), *(self.store.key(mark_name(i)) for i in ids)]
            self._mark(keys=keys, args=[ttl_ms, *ids])

    def cancelled_since(self, since_ms: int) -> tuple[dict[str, int], int]:
        reply = self._since(keys=[self.store.key("cancels")], args=[since_ms])
        try:
            now, flat = reply
            marks = {reply_text(flat[i]): int(float(reply_text(flat[i + 1]))) for i in range(0, len(flat), 2)}
            return marks, int(now)
        except (TypeError, ValueError) as exc:  # a reply of the wrong shape
            raise StoreUnavailable(f"unexpected reply to cancelled_since: {exc}") from exc

    def cancelled_among(self, ids: list[str]) -> set[str]:
        if not ids:
            return set()
        with self.store.errors():
            values = self.store.client.mget([self.store.key(mark_name(i)) for i in ids])
        return {i for i, value in zip(ids, values, strict=True) if value is not None}


_SCHEMA = """
CREATE TABLE IF NOT EXISTS cancel_marks (
    id TEXT PRIMARY KEY,
    marked_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS cancel_marks_at ON cancel_marks (marked_at)
"""


class SqliteCancelMarks(CancelMarks):
    def __init__(self, store: SqliteStore) -> None:
        self.store = store
        store.ensure_schema(_SCHEMA)

    def mark_cancelled(self, ids: list[str], ttl_ms: int) -> None:
        with self.store.transaction() as conn:
            # Read once the write lock is held: a mark dated before a wait for it (up to the busy
            # timeout, longer than the pollers' overlap) could fall behind a poll made meanwhile.
            now = self.store.now_ms()
            conn.executemany(
                "INSERT OR REPLACE INTO cancel_marks (id, marked_at, expires_at) VALUES (?, ?, ?)",
                [(self.store.key(i), now, now + ttl_ms) for i in ids],
            )
            conn.execute("DELETE FROM cancel_marks WHERE expires_at <= ?", (now,))

    def cancelled_since(self, since_ms: int) -> tuple[dict[str, int], int]:
        now = self.store.now_ms()
        prefix = self.store.key("")
        rows = self.store.rows(
            "SELECT id, marked_at FROM cancel_marks WHERE marked_at >= ? AND expires_at > ?", (since_ms, now)
        )
        return {i.removeprefix(prefix): at for i, at in rows if i.startswith(prefix)}, now

    def cancelled_among(self, ids: list[str]) -> set[str]:
        if not ids:
            return set()
        names = {self.store.key(i): i for i in ids}
        marks = ",".join("?" * len(names))
        now = self.store.now_ms()
        rows = self.store.rows(
            f"SELECT id FROM cancel_marks WHERE id IN ({marks}) AND expires_at > ?", (*names, now)
        )
        return {names[row[0]] for row in rows}


def cancel_marks(store: StateStore) -> CancelMarks:
    """The cancellation marks' operations for ``store``'s backend."""
    return store.operations(Backends(redis=RedisCancelMarks, sqlite=SqliteCancelMarks))
