"""The operators' audit log in the state store: who did what, when, to how many, with which filter.

An action is written *before* it runs (``start``: who, when, what, the filter or selection) and
completed after (``finish``: how many, the outcome), so an action that was cut short still shows,
as ``started``; and an action whose entry cannot be written does not run (the caller refuses).
The newest ``MAX_ENTRIES`` are kept.

Redis: records in the hash ``audit:rec`` (field: the entry's id) and their times in the sorted
set ``audit:ix``. SQLite: the table ``audit_log``.
"""

from __future__ import annotations

import json
import uuid
from abc import ABC, abstractmethod
from typing import Any

from jobsystem.store.base import Backends, StateStore
from jobsystem.store.redis import RedisStore
from jobsystem.store.sorted_index import Cursor, redis_walk
from jobsystem.store.sqlite import SqliteStore

__all__ = ["MAX_ENTRIES", "AuditBackend", "audit_backend"]

#: Entries kept (the oldest go first).
MAX_ENTRIES = 10_000


class AuditBackend(ABC):
    """The audit log's operations, one implementation per store backend."""

    @abstractmethod
    def start(self, entry: dict[str, Any], at_ms: int) -> str:
        """Write ``entry`` (state ``started``) and return its id."""

    @abstractmethod
    def finish(self, entry_id: str, changes: dict[str, Any]) -> None:
        """Complete entry ``entry_id`` with ``changes`` (state, count, outcome)."""

    @abstractmethod
    def page(self, cursor: Cursor | None, limit: int) -> tuple[list[dict[str, Any]], Cursor | None]:
        """Entries, newest first."""


class RedisAudit(AuditBackend):
    def __init__(self, store: RedisStore) -> None:
        self.store = store

    def start(self, entry: dict[str, Any], at_ms: int) -> str:
        entry_id = uuid.uuid4().hex
        records, times = self.store.key("audit:rec"), self.store.key("audit:ix")
        with self.store.errors():
            pipe = self.store.client.pipeline(transaction=True)
            pipe.hset(
                records, entry_id, json.dumps({**entry, "id": entry_id, "at": at_ms, "state": "started"})
            )
            pipe.zadd(times, {entry_id: at_ms})
            pipe.zrange(times, 0, -MAX_ENTRIES - 1)
            old = pipe.execute()[-1]
            if old:
                self.store.client.zrem(times, *old)
                self.store.client.hdel(records, *old)
        return entry_id

    def finish(self, entry_id: str, changes: dict[str, Any]) -> None:
        records = self.store.key("audit:rec")
        with self.store.errors():
            raw = self.store.client.hget(records, entry_id)
            if raw is not None:
                self.store.client.hset(records, entry_id, json.dumps({**json.loads(raw), **changes}))

    def page(self, cursor: Cursor | None, limit: int) -> tuple[list[dict[str, Any]], Cursor | None]:
        walk = redis_walk(self.store, self.store.key("audit:ix"), [], cursor, limit)
        if not walk.entries:
            return [], None
        with self.store.errors():
            raw = self.store.client.hmget(self.store.key("audit:rec"), [m for m, _ in walk.entries])
        return [json.loads(value) for value in raw if value is not None], walk.next


_SCHEMA = """
CREATE TABLE IF NOT EXISTS audit_log (
    id INTEGER PRIMARY KEY,
    ns TEXT NOT NULL,
    at INTEGER NOT NULL,
    entry TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS audit_log_at ON audit_log (ns, at)
"""


class SqliteAudit(AuditBackend):
    def __init__(self, store: SqliteStore) -> None:
        self.store = store
        store.ensure_schema(_SCHEMA)

    def start(self, entry: dict[str, Any], at_ms: int) -> str:
        ns = self.store.namespace
        with self.store.transaction() as conn:
            cursor = conn.execute("INSERT INTO audit_log (ns, at, entry) VALUES (?, ?, '{}')", (ns, at_ms))
            entry_id = str(cursor.lastrowid)
            record = {**entry, "id": entry_id, "at": at_ms, "state": "started"}
            conn.execute("UPDATE audit_log SET entry = ? WHERE id = ?", (json.dumps(record), entry_id))
            conn.execute(
                "DELETE FROM audit_log WHERE ns = ? AND id IN (SELECT id FROM audit_log WHERE ns = ? "
                "ORDER BY at DESC, id DESC LIMIT -1 OFFSET ?)",
                (ns, ns, MAX_ENTRIES),
            )
        return entry_id

    def finish(self, entry_id: str, changes: dict[str, Any]) -> None:
        with self.store.transaction() as conn:
            row = conn.execute("SELECT entry FROM audit_log WHERE id = ?", (entry_id,)).fetchone()
            if row is not None:
                merged = json.dumps({**json.loads(row[0]), **changes})
                conn.execute("UPDATE audit_log SET entry = ? WHERE id = ?", (merged, entry_id))

    def page(self, cursor: Cursor | None, limit: int) -> tuple[list[dict[str, Any]], Cursor | None]:
        clauses, params = "ns = ?", list[Any]([self.store.namespace])
        if cursor is not None:
            clauses += " AND (at, id) < (?, ?)"
            params += [cursor.at, cursor.seq]
        rows = self.store.rows(
            f"SELECT entry, at, id FROM audit_log WHERE {clauses} ORDER BY at DESC, id DESC LIMIT ?",
            (*params, limit + 1),
        )
        last = rows[limit - 1] if len(rows) > limit else None
        return [json.loads(r[0]) for r in rows[:limit]], Cursor(int(last[1]), str(last[2])) if last else None


def audit_backend(store: StateStore) -> AuditBackend:
    """The audit log for ``store``'s backend."""
    return store.operations(Backends(redis=RedisAudit, sqlite=SqliteAudit))
