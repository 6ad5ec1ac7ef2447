"""Job status records in the state store: one record per message id, and per-queue counters.

The records and their order are :mod:`jobsystem.store.status_records`. Many updates go to the
store at once: one Lua script call on Redis, one transaction on SQLite. Each accepted change of
state, in the same call, also counts one in the queue's counters (``succeeded``, ``dead``...),
which outlive the records' TTL and give the totals that ``jobctl health`` prints; counts one in
the queue's per-minute counts and appends to the record's timeline
(:mod:`jobsystem.store.status_history`); and files the record in the job index
(:mod:`jobsystem.store.job_index`), which the dashboard pages through. Several updates of one
message in a batch are folded: each record is written, and filed in the index, once per batch
(:mod:`jobsystem.store.status_fold`).
"""

from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod

from jobsystem.store import job_index, status_history
from jobsystem.store import scheduled as scheduled_index
from jobsystem.store.base import Backends, StateStore
from jobsystem.store.job_index import JobFilter
from jobsystem.store.redis import RedisStore, reply_text
from jobsystem.store.scheduled import Scheduled
from jobsystem.store.sorted_index import Cursor, Walk
from jobsystem.store.sqlite import SqliteStore
from jobsystem.store.status_fold import APPLY_LUA, sqlite_apply
from jobsystem.store.status_records import JobStatus, StatusUpdate, encode_updates

__all__ = ["RedisStatus", "SqliteStatus", "StatusBackend", "status_backend"]


class StatusBackend(ABC):
    """The status operations, one implementation per store backend."""

    @abstractmethod
    def apply(self, updates: list[StatusUpdate], ttl_ms: int) -> None:
        """Apply ``updates`` in order (several may concern one message); records live ``ttl_ms``."""

    @abstractmethod
    def get(self, message_id: str) -> JobStatus | None:
        """The record of ``message_id``, or None when unknown or expired."""

    @abstractmethod
    def counts(self, queues: list[str]) -> dict[str, dict[str, int]]:
        """For each queue, how many jobs entered each state since the counters began."""

    @abstractmethod
    def get_many(self, message_ids: list[str]) -> dict[str, JobStatus]:
        """The records of ``message_ids`` that exist, in one round trip."""

    @abstractmethod
    def walk(self, job_filter: JobFilter, cursor: Cursor | None, limit: int) -> Walk:
        """A page of message ids from the job index, newest sent first."""

    @abstractmethod
    def total(self, job_filter: JobFilter) -> tuple[int, bool]:
        """How many indexed jobs match, and whether that count is exact."""

    @abstractmethod
    def scheduled(self, queues: list[str], soon_ms: int = 0) -> dict[str, Scheduled]:
        """Per queue, how many jobs wait in the delay cascade, when the next is due, and how many
        are due within ``soon_ms`` of now, either side."""

    @abstractmethod
    def minutes(self, queues: list[str], since_ms: int) -> dict[str, dict[int, dict[str, int]]]:
        """Per queue, per minute (ms of its start) since ``since_ms``: jobs entering each state."""

    def page(
        self, job_filter: JobFilter, cursor: Cursor | None = None, limit: int = 50
    ) -> tuple[list[JobStatus], Cursor | None]:
        """The records of one page of the job index (expired ones left out), and the next cursor."""
        walk = self.walk(job_filter, cursor, limit)
        found = self.get_many([message_id for message_id, _ in walk.entries])
        return [found[m] for m, _ in walk.entries if m in found], walk.next


class RedisStatus(StatusBackend):
    """Records as Redis hashes ``status:<message id>``; counters as hashes ``status-counts:<queue>``."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self._apply = store.script(APPLY_LUA)

    def _key(self, message_id: str) -> str:
        return self.store.key("status:" + message_id)

    def _counts_key(self, queue: str) -> str:
        return self.store.key("status-counts:" + queue)

    def apply(self, updates: list[StatusUpdate], ttl_ms: int) -> None:
        """One script call for all the updates: one round trip, whatever their number."""
        if not updates:
            return
        args = [ttl_ms, int(time.time() * 1000), self.store.namespace, encode_updates(updates)]
        with self.store.errors():
            self._apply(keys=[], args=args)

    def get(self, message_id: str) -> JobStatus | None:
        with self.store.errors():
            raw = self.store.client.hgetall(self._key(message_id))
        if not raw:
            return None
        return JobStatus.from_fields(message_id, {reply_text(k): reply_text(v) for k, v in raw.items()})

    def counts(self, queues: list[str]) -> dict[str, dict[str, int]]:
        with self.store.errors():
            pipe = self.store.client.pipeline(transaction=False)
            for queue in queues:
                pipe.hgetall(self._counts_key(queue))
            replies = pipe.execute()
        return {
            queue: {reply_text(k): int(v) for k, v in reply.items()}
            for queue, reply in zip(queues, replies, strict=True)
        }

    def get_many(self, message_ids: list[str]) -> dict[str, JobStatus]:
        with self.store.errors():
            pipe = self.store.client.pipeline(transaction=False)
            for message_id in message_ids:
                pipe.hgetall(self._key(message_id))
            replies = pipe.execute()
        return {
            m: JobStatus.from_fields(m, {reply_text(k): reply_text(v) for k, v in raw.items()})
            for m, raw in zip(message_ids, replies, strict=True)
            if raw
        }

    def walk(self, job_filter: JobFilter, cursor: Cursor | None, limit: int) -> Walk:
        return job_index.redis_page(self.store, job_filter, cursor, limit)

    def total(self, job_filter: JobFilter) -> tuple[int, bool]:
        return job_index.redis_total(self.store, job_filter)

    def minutes(self, queues: list[str], since_ms: int) -> dict[str, dict[int, dict[str, int]]]:
        return status_history.redis_minutes(self.store, queues, since_ms)

    def scheduled(self, queues: list[str], soon_ms: int = 0) -> dict[str, Scheduled]:
        return scheduled_index.redis_scheduled(self.store, queues, soon_ms)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS job_status (
    key TEXT PRIMARY KEY,
    ord INTEGER NOT NULL,
    fields TEXT NOT NULL,
    expires_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS job_status_expires ON job_status (expires_at);
CREATE TABLE IF NOT EXISTS job_status_counts (
    queue TEXT NOT NULL,
    state TEXT NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (queue, state)
)
"""


class SqliteStatus(StatusBackend):
    """Records as JSON rows of one table; a batch of updates is one ``BEGIN IMMEDIATE`` transaction."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store
        store.ensure_schema(_SCHEMA)
        store.ensure_schema(job_index.SQLITE_SCHEMA)
        store.ensure_schema(status_history.SQLITE_SCHEMA)
        store.ensure_schema(scheduled_index.SQLITE_SCHEMA)
        self._swept_minute = 0

    def apply(self, updates: list[StatusUpdate], ttl_ms: int) -> None:
        if not updates:
            return
        now = self.store.now_ms()
        with self.store.transaction() as conn:
            sqlite_apply(self.store, conn, updates, ttl_ms, now)
            # Reads skip expired rows already; this reclaims their space, using the index.
            conn.execute("DELETE FROM job_status WHERE expires_at <= ?", (now,))
            conn.execute("DELETE FROM job_index WHERE expires_at <= ?", (now,))
            if now // 60_000 != self._swept_minute:  # once a minute is plenty
                self._swept_minute = now // 60_000
                status_history.sqlite_sweep_minutes(conn, now)

    def get(self, message_id: str) -> JobStatus | None:
        rows = self.store.rows(
            "SELECT fields FROM job_status WHERE key = ? AND expires_at > ?",
            (self.store.key(message_id), self.store.now_ms()),
        )
        return JobStatus.from_fields(message_id, json.loads(rows[0][0])) if rows else None

    def counts(self, queues: list[str]) -> dict[str, dict[str, int]]:
        return {
            queue: {
                state: int(count)
                for state, count in self.store.rows(
                    "SELECT state, count FROM job_status_counts WHERE queue = ?", (self.store.key(queue),)
                )
            }
            for queue in queues
        }

    def get_many(self, message_ids: list[str]) -> dict[str, JobStatus]:
        if not message_ids:
            return {}
        marks = ",".join("?" * len(message_ids))
        rows = self.store.rows(
            f"SELECT key, fields FROM job_status WHERE key IN ({marks}) AND expires_at > ?",
            (*(self.store.key(m) for m in message_ids), self.store.now_ms()),
        )
        size = len(self.store.namespace)
        return {str(k)[size:]: JobStatus.from_fields(str(k)[size:], json.loads(f)) for k, f in rows}

    def walk(self, job_filter: JobFilter, cursor: Cursor | None, limit: int) -> Walk:
        return job_index.sqlite_page(self.store, job_filter, cursor, limit)

    def total(self, job_filter: JobFilter) -> tuple[int, bool]:
        return job_index.sqlite_total(self.store, job_filter)

    def scheduled(self, queues: list[str], soon_ms: int = 0) -> dict[str, Scheduled]:
        return scheduled_index.sqlite_scheduled(self.store, queues, soon_ms)

    def minutes(self, queues: list[str], since_ms: int) -> dict[str, dict[int, dict[str, int]]]:
        with self.store.errors():
            conn = self.store.connection()
            return status_history.sqlite_minutes(conn, {q: self.store.key(q) for q in queues}, since_ms)


def status_backend(store: StateStore) -> StatusBackend:
    """The status operations for ``store``'s backend."""
    return store.operations(Backends(redis=RedisStatus, sqlite=SqliteStatus))
