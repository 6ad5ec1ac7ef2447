"""Cancellation marks in the state store: which jobs were cancelled, and when.

A mark is either a message id (a direct ``cancel(message_id)``: it stops that id wherever it runs)
or a pair (message id, workflow id) written by ``cancel(workflow_id)``: it stops the message as
that workflow's member only. One message (one id) may be a member of two workflows, and
cancelling one must not stop the copy in the other. A mark lives ``ttl_ms`` (``CANCEL_TTL_MS``),
so it outlives a worker restart and reaches every host.

Redis: the key ``cancel:<id>`` and the sorted set ``cancels`` (id by the store time it was
marked, for the workers' pollers, pruned as marks are added), as the previous release wrote them;
a pair also writes ``cancel:<id>:<workflow id>`` and the sorted set ``cancels:wf`` (members
``"<id> <workflow id>"``), and holds ``cancel:<id>`` at :data:`IN_WORKFLOWS` unless it is marked
by id already. SQLite: the table ``cancel_marks`` (the id's row, as before), ``cancel_pairs``,
and ``cancel_in_workflows`` (ids whose row a pair wrote; a trigger drops the flag when a writer
of either release marks the id again by id).

Mixed releases: a worker of the previous release reads ``cancel:<id>`` / the id's row and the
id in ``cancels`` only, so it takes a pair's mark for a mark by id and stops the message in every
workflow, as it did before (it never runs a member of a cancelled workflow). A mark by id of the
previous release (``cancel:<id>`` = ``1``, a row with no flag) stops the id everywhere here too.
Message and workflow ids are UUIDs: no personal data in a key name.
"""

from __future__ import annotations

import sqlite3
from abc import ABC, abstractmethod
from collections.abc import Sequence

from jobsystem.store.base import Backends, StateStore, StoreUnavailable
from jobsystem.store.redis import RedisStore, reply_text
from jobsystem.store.sqlite import SqliteStore

__all__ = [
    "IN_WORKFLOWS",
    "CancelMarks",
    "Mark",
    "cancel_marks",
    "mark_name",
    "pair_mark_name",
    "sqlite_marked",
]

#: A mark: a message id (stopped wherever it runs), or (message id, workflow id): stopped as
#: that workflow's member only.
Mark = str | tuple[str, str]

#: The value of ``cancel:<id>`` on Redis when only pairs mark the id: a reader of this release
#: looks at the pairs; one of the previous release sees a mark and stops the id everywhere.
IN_WORKFLOWS = "w"


def mark_name(message_id: str) -> str:
    """The key of ``message_id``'s mark on Redis (in the store's namespace); the workflows'
    scripts read it (:mod:`jobsystem.store.workflows`)."""
    return f"cancel:{message_id}"


def pair_mark_name(message_id: str, workflow_id: str) -> str:
    """The key of the mark that stops ``message_id`` as ``workflow_id``'s member only."""
    return f"cancel:{message_id}:{workflow_id}"


#: Whether a message id carries a mark by id, or a pair's mark in the workflow asked about
#: (parameters: the id, now, the id, the workflow id, now).
_SQLITE_MARKED = """
SELECT 1 FROM cancel_marks AS m WHERE m.id = ? AND m.expires_at > ?
  AND NOT EXISTS (SELECT 1 FROM cancel_in_workflows AS f WHERE f.id = m.id)
UNION ALL
SELECT 1 FROM cancel_pairs WHERE id = ? AND wid = ? AND expires_at > ?
"""


def sqlite_marked(conn: sqlite3.Connection, store: SqliteStore, message_id: str, workflow_id: str) -> bool:
    """Whether ``message_id`` is marked, by id or as ``workflow_id``'s member, read in the
    caller's SQLite transaction."""
    key, now = store.key(message_id), store.now_ms()
    return conn.execute(_SQLITE_MARKED, (key, now, key, workflow_id, now)).fetchone() is not None


class CancelMarks(ABC):
    """The cancellation marks' operations, one implementation per store backend."""

    @abstractmethod
    def mark_cancelled(self, marks: Sequence[Mark], ttl_ms: int) -> None:
        """Mark message ids, and (message id, workflow id) pairs, cancelled for ``ttl_ms``, in
        one atomic write."""

    @abstractmethod
    def cancelled_among(self, marks: Sequence[Mark]) -> set[Mark]:
        """Which of ``marks`` are stopped (one round trip): an id marked by id; a pair marked as
        such, or whose id is marked by id. An id that only pairs mark is not stopped by itself."""

    @abstractmethod
    def cancelled_since(self, since_ms: int) -> tuple[dict[Mark, int], int]:
        """The marks made at or after ``since_ms`` (store clock) with when, and the store's time
        now (one round trip): what a worker's poller adds to what it knows."""


# KEYS: the ids' sorted set, the pairs', then two per mark: the id's mark and the pair's (the
# id's again for a mark by id). ARGV: the TTL, then per mark its id and workflow id ('': by id).
# A pair keeps a mark by id as it is (it only lengthens it), else holds the id's key at 'w' as long
# as its longest pair: a reader of the previous release stops the id for as long as before.
_MARK = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
for i = 3, #KEYS, 2 do
  local id, wf = ARGV[i - 1], ARGV[i]
  if wf == '' then
    redis.call('SET', KEYS[i], '1', 'PX', ttl)
  else
    local held = redis.call('GET', KEYS[i])
    local value = (held and held ~= 'w') and held or 'w'
    redis.call('SET', KEYS[i], value, 'PX', math.max(ttl, redis.call('PTTL', KEYS[i])))
    redis.call('SET', KEYS[i + 1], '1', 'PX', ttl)
    redis.call('ZADD', KEYS[2], now, id .. ' ' .. wf)
  end
  redis.call('ZADD', KEYS[1], now, id)
end
for _, set in ipairs({KEYS[1], KEYS[2]}) do
  redis.call('ZREMRANGEBYSCORE', set, '-inf', now - ttl)
  redis.call('PEXPIRE', set, ttl)
end
return now
"""

# KEYS: the ids' sorted set, the pairs'. ARGV: since, the namespace's mark prefix. An id whose mark
# is held for pairs only ('w'), or gone (expired), is no mark by id.
_SINCE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[1], '+inf', 'WITHSCORES')
local by_id = {}
for i = 1, #ids, 2 do
  local held = redis.call('GET', ARGV[2] .. ids[i])
  if held and held ~= 'w' then
    by_id[#by_id + 1] = ids[i]
    by_id[#by_id + 1] = ids[i + 1]
  end
end
return {now, by_id, redis.call('ZRANGEBYSCORE', KEYS[2], ARGV[1], '+inf', 'WITHSCORES')}
"""


def _split(marks: Sequence[Mark]) -> tuple[list[str], list[tuple[str, str]]]:
    """``marks`` as the ids marked by id and the pairs."""
    return [m for m in marks if isinstance(m, str)], [m for m in marks if not isinstance(m, str)]


class RedisCancelMarks(CancelMarks):
    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self._mark = store.script(_MARK)
        self._since = store.script(_SINCE)

    def _sets(self) -> list[str]:
        return [self.store.key("cancels"), self.store.key("cancels:wf")]

    def mark_cancelled(self, marks: Sequence[Mark], ttl_ms: int) -> None:
        if not marks:
            return
        keys, args = self._sets(), [str(ttl_ms)]
        for mark in marks:
            message_id, workflow_id = (mark, "") if isinstance(mark, str) else mark
            keys.append(self.store.key(mark_name(message_id)))
            keys.append(self.store.key(pair_mark_name(message_id, workflow_id) if workflow_id else keys[-1]))
            args += [message_id, workflow_id]
        self._mark(keys=keys, args=args)

    def cancelled_since(self, since_ms: int) -> tuple[dict[Mark, int], int]:
        reply = self._since(keys=self._sets(), args=[since_ms, self.store.key(mark_name(""))])
        try:
            now, by_id, pairs = reply
            marks: dict[Mark, int] = {reply_text(m): int(float(reply_text(at))) for m, at in _pairs(by_id)}
            for member, at in _pairs(pairs):
                message_id, _, workflow_id = reply_text(member).rpartition(" ")
                marks[(message_id, workflow_id)] = int(float(reply_text(at)))
            return marks, int(now)
        except (TypeError, ValueError) as exc:  # a reply of the wrong shape
            raise StoreUnavailable(f"unexpected reply to cancelled_since: {exc}") from exc

    def cancelled_among(self, marks: Sequence[Mark]) -> set[Mark]:
        if not marks:
            return set()
        ids = list(dict.fromkeys(m if isinstance(m, str) else m[0] for m in marks))
        pairs = list(dict.fromkeys(m for m in marks if not isinstance(m, str)))
        names = [mark_name(i) for i in ids] + [pair_mark_name(*p) for p in pairs]
        with self.store.errors():
            values = self.store.client.mget([self.store.key(n) for n in names])
        held = zip(ids, values[: len(ids)], strict=True)
        by_id = {i for i, value in held if value is not None and reply_text(value) != IN_WORKFLOWS}
        paired = {p for p, v in zip(pairs, values[len(ids) :], strict=True) if v is not None}
        return {m for m in marks if (m if isinstance(m, str) else m[0]) in by_id or m in paired}


def _pairs(flat: list[object]) -> list[tuple[object, object]]:
    """A ``WITHSCORES`` reply as (member, score) pairs."""
    return [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]


_SCHEMA = """
CREATE TABLE IF NOT EXISTS cancel_marks (
    id TEXT PRIMARY KEY,
    marked_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS cancel_marks_at ON cancel_marks (marked_at);
CREATE TABLE IF NOT EXISTS cancel_pairs (
    id TEXT NOT NULL,
    wid TEXT NOT NULL,
    marked_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (id, wid)
);
CREATE INDEX IF NOT EXISTS cancel_pairs_at ON cancel_pairs (marked_at);
CREATE TABLE IF NOT EXISTS cancel_in_workflows (id TEXT PRIMARY KEY);
CREATE TRIGGER IF NOT EXISTS cancel_marked_by_id AFTER INSERT ON cancel_marks
BEGIN
    DELETE FROM cancel_in_workflows WHERE id = NEW.id;
END;
CREATE TRIGGER IF NOT EXISTS cancel_mark_deleted AFTER DELETE ON cancel_marks
BEGIN
    DELETE FROM cancel_in_workflows WHERE id = OLD.id;
END
"""

#: The marks made since a time: by id (the id's row with no flag), then the pairs'.
_SQLITE_SINCE = """
SELECT m.id, NULL, m.marked_at FROM cancel_marks AS m WHERE m.marked_at >= ? AND m.expires_at > ?
  AND NOT EXISTS (SELECT 1 FROM cancel_in_workflows AS f WHERE f.id = m.id)
UNION ALL
SELECT id, wid, marked_at FROM cancel_pairs WHERE marked_at >= ? AND expires_at > ?
"""


class SqliteCancelMarks(CancelMarks):
    def __init__(self, store: SqliteStore) -> None:
        self.store = store
        store.ensure_schema(_SCHEMA)

    def mark_cancelled(self, marks: Sequence[Mark], ttl_ms: int) -> None:
        by_id, pairs = _split(marks)
        with self.store.transaction() as conn:
            # Read once the write lock is held: a mark dated before a wait for it (up to the busy
            # timeout, longer than the pollers' overlap) could fall behind a poll made meanwhile.
            now = self.store.now_ms()
            conn.execute("DELETE FROM cancel_marks WHERE expires_at <= ?", (now,))
            conn.execute("DELETE FROM cancel_pairs WHERE expires_at <= ?", (now,))
            conn.executemany(  # as the previous release: the trigger drops a flag of pairs
                "INSERT OR REPLACE INTO cancel_marks (id, marked_at, expires_at) VALUES (?, ?, ?)",
                [(self.store.key(i), now, now + ttl_ms) for i in by_id],
            )
            for message_id, workflow_id in pairs:
                self._mark_pair(conn, self.store.key(message_id), workflow_id, now, ttl_ms)

    @staticmethod
    def _mark_pair(conn: sqlite3.Connection, key: str, workflow_id: str, now: int, ttl_ms: int) -> None:
        """The pair's row, and the id's row (read by the previous release) flagged as held for
        pairs only, unless it is marked by id already: that one stays so, lengthened if shorter."""
        held = conn.execute(
            "SELECT m.expires_at, EXISTS (SELECT 1 FROM cancel_in_workflows AS f WHERE f.id = m.id) "
            "FROM cancel_marks AS m WHERE m.id = ?",
            (key,),
        ).fetchone()
        expires = max(now + ttl_ms, held[0] if held else 0)
        conn.execute(
            "INSERT OR REPLACE INTO cancel_marks (id, marked_at, expires_at) VALUES (?, ?, ?)",
            (key, now, expires),
        )
        if held is None or held[1]:  # the insert's trigger dropped the flag: not marked by id
            conn.execute("INSERT OR IGNORE INTO cancel_in_workflows (id) VALUES (?)", (key,))
        conn.execute(
            "INSERT OR REPLACE INTO cancel_pairs (id, wid, marked_at, expires_at) VALUES (?, ?, ?, ?)",
            (key, workflow_id, now, now + ttl_ms),
        )

    def cancelled_since(self, since_ms: int) -> tuple[dict[Mark, int], int]:
        now = self.store.now_ms()
        prefix = self.store.key("")
        rows = self.store.rows(_SQLITE_SINCE, (since_ms, now, since_ms, now))
        marks: dict[Mark, int] = {}
        for key, workflow_id, at in rows:
            if key.startswith(prefix):
                message_id = key.removeprefix(prefix)
                marks[message_id if workflow_id is None else (message_id, workflow_id)] = at
        return marks, now

    def cancelled_among(self, marks: Sequence[Mark]) -> set[Mark]:
        if not marks:
            return set()
        keys = {self.store.key(m if isinstance(m, str) else m[0]) for m in marks}
        places = ",".join("?" * len(keys))
        now = self.store.now_ms()
        rows = self.store.rows(
            f"SELECT m.id, NULL FROM cancel_marks AS m WHERE m.id IN ({places}) AND m.expires_at > ? "
            "AND NOT EXISTS (SELECT 1 FROM cancel_in_workflows AS f WHERE f.id = m.id) UNION ALL "
            f"SELECT id, wid FROM cancel_pairs WHERE id IN ({places}) AND expires_at > ?",
            (*keys, now, *keys, now),
        )
        by_id = {key for key, workflow_id in rows if workflow_id is None}
        paired = {(key, workflow_id) for key, workflow_id in rows if workflow_id is not None}
        found: set[Mark] = set()
        for mark in marks:
            key = self.store.key(mark if isinstance(mark, str) else mark[0])
            if key in by_id or (not isinstance(mark, str) and (key, mark[1]) in paired):
                found.add(mark)
        return found


def cancel_marks(store: StateStore) -> CancelMarks:
    """The cancellation marks' operations for ``store``'s backend."""
    return store.operations(Backends(redis=RedisCancelMarks, sqlite=SqliteCancelMarks))
