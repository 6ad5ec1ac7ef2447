"""Token buckets in SQLite: the same arithmetic as the Redis script (``jobsystem.store.buckets``,
where the contract is described), in Python inside one ``BEGIN IMMEDIATE`` transaction.

Slot records are rows of their own table (bucket, owner, slot), written only when a take defers
and read only when a slot is brought back, in the take's transaction; passed ones are deleted
when a record is written or read, drained ones by the drain.
"""

from __future__ import annotations

import sqlite3
import time

from jobsystem.store.buckets import (
    LINGER_MS,
    BucketBackend,
    Level,
    Take,
    TakeRequest,
    _Bucket,
    _honour,
    _level,
    _live_slot,
    _recorded,
    _refill,
    _take,
    _ttl_ms,
)
from jobsystem.store.sqlite import SqliteStore

__all__ = ["SqliteBuckets"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS rate_buckets (
    key TEXT PRIMARY KEY,
    tokens REAL NOT NULL,
    ts REAL NOT NULL,
    blocked_until REAL NOT NULL,
    expires_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS rate_buckets_expires ON rate_buckets (expires_at);
CREATE TABLE IF NOT EXISTS rate_bucket_leases (
    key TEXT PRIMARY KEY,
    leased REAL NOT NULL,
    lease_end REAL NOT NULL,
    expires_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS rate_bucket_slots (
    key TEXT NOT NULL,
    owner TEXT NOT NULL,
    at INTEGER NOT NULL,
    PRIMARY KEY (key, owner, at)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS rate_bucket_slots_at ON rate_bucket_slots (at)
"""


class SqliteBuckets(BucketBackend):
    """Buckets as rows of one table (their lease periods and slot records in others, which workers
    of earlier releases ignore); every take runs in a ``BEGIN IMMEDIATE`` transaction."""

    def __init__(self, store: SqliteStore, *, linger_ms: int = LINGER_MS) -> None:
        self.store = store
        self.linger_ms = linger_ms
        store.ensure_schema(_SCHEMA)

    @staticmethod
    def _now() -> float:
        # The store's clock for SQLite is the host's (one host); sub-millisecond, like Redis TIME.
        return time.time() * 1000

    def _load(self, conn: sqlite3.Connection, key: str, now: float) -> _Bucket | None:
        row = conn.execute(
            "SELECT b.tokens, b.ts, b.blocked_until, coalesce(l.leased, 0), coalesce(l.lease_end, 0) "
            "FROM rate_buckets b LEFT JOIN rate_bucket_leases l ON l.key = b.key "
            "WHERE b.key = ? AND b.expires_at > ?",
            (self.store.key(key), now),
        ).fetchone()
        return _Bucket(*(float(value) for value in row)) if row else None

    def _save(self, conn: sqlite3.Connection, key: str, bucket: _Bucket, burst: float, rate: float) -> None:
        expires = bucket.ts + _ttl_ms(bucket, burst, rate, bucket.ts, self.linger_ms)
        conn.execute(
            "INSERT INTO rate_buckets (key, tokens, ts, blocked_until, expires_at) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT(key) DO UPDATE SET tokens = excluded.tokens, ts = excluded.ts, "
            "blocked_until = excluded.blocked_until, expires_at = excluded.expires_at",
            (self.store.key(key), bucket.tokens, bucket.ts, bucket.blocked_until, expires),
        )
        if bucket.lease_end:
            conn.execute(
                "INSERT OR REPLACE INTO rate_bucket_leases (key, leased, lease_end, expires_at) "
                "VALUES (?, ?, ?, ?)",
                (self.store.key(key), bucket.leased, bucket.lease_end, expires),
            )

    def take_many(self, requests: list[TakeRequest]) -> list[Take]:
        """All the requests in one transaction; expired rows are swept on the way."""
        answers: list[Take] = []
        with self.store.transaction() as conn:
            now = self._now()
            conn.execute("DELETE FROM rate_buckets WHERE expires_at <= ?", (now,))
            conn.execute("DELETE FROM rate_bucket_leases WHERE expires_at <= ?", (now,))
            for request in requests:
                bucket = _refill(self._load(conn, request.key, now), request, now)
                answers.append(self._answer(conn, bucket, request, now))
        return answers

    def _answer(self, conn: sqlite3.Connection, bucket: _Bucket, request: TakeRequest, now: float) -> Take:
        """Honour the slot ``request`` brings back if it is on record, else take afresh (and record
        a deferral's slot); the script's twin."""
        slot = _live_slot(bucket, request, now)
        if slot is not None:
            conn.execute("DELETE FROM rate_bucket_slots WHERE at < ?", (now,))
            where = "WHERE key = ? AND owner = ? AND at = ?"
            record = (self.store.key(request.key), request.owner, slot)
            if conn.execute(f"SELECT 1 FROM rate_bucket_slots {where}", record).fetchone():
                answer = _honour(slot, now)
                if answer.wait_ms <= request.sleep_ms:
                    conn.execute(f"DELETE FROM rate_bucket_slots {where}", record)
                return answer
        answer, changed = _take(bucket, request, now)
        if changed:
            self._save(conn, request.key, bucket, request.burst, request.rate)
        if _recorded(answer, request):
            conn.execute("DELETE FROM rate_bucket_slots WHERE at < ?", (now,))
            conn.execute(
                "INSERT OR IGNORE INTO rate_bucket_slots (key, owner, at) VALUES (?, ?, ?)",
                (self.store.key(request.key), request.owner, answer.at_ms),
            )
        return answer

    def peek(self, key: str, rate: float, burst: float) -> Level:
        now = self._now()
        with self.store.errors():
            conn = self.store.connection()
            stored = self._load(conn, key, now)
            (deferred,) = conn.execute(
                "SELECT count(*) FROM rate_bucket_slots WHERE key = ? AND at >= ?", (self.store.key(key), now)
            ).fetchone()
        return _level(_refill(stored, TakeRequest(key, rate, burst, 0, 0), now), int(deferred))

    def drain(self, key: str, rate: float, burst: float, for_ms: int) -> None:
        with self.store.transaction() as conn:
            self._drain_in(conn, self._now(), key, rate, burst, for_ms)

    def drain_and_take(self, for_ms: int, request: TakeRequest) -> Take:
        with self.store.transaction() as conn:
            now = self._now()
            bucket = self._drain_in(conn, now, request.key, request.rate, request.burst, for_ms)
            return self._answer(conn, bucket, request, now)

    def _drain_in(
        self, conn: sqlite3.Connection, now: float, key: str, rate: float, burst: float, for_ms: int
    ) -> _Bucket:
        bucket = _refill(self._load(conn, key, now), TakeRequest(key, rate, burst, 0, 0), now)
        bucket.tokens = min(bucket.tokens, -rate * for_ms / 1000)
        bucket.blocked_until = max(bucket.blocked_until, now + for_ms)
        self._save(conn, key, bucket, burst, rate)
        conn.execute(
            "DELETE FROM rate_bucket_slots WHERE key = ? AND at < ?",
            (self.store.key(key), bucket.blocked_until),
        )
        return bucket

    def reset(self, key: str) -> None:
        with self.store.transaction() as conn:
            conn.execute("DELETE FROM rate_buckets WHERE key = ?", (self.store.key(key),))
            conn.execute("DELETE FROM rate_bucket_leases WHERE key = ?", (self.store.key(key),))
            conn.execute("DELETE FROM rate_bucket_slots WHERE key = ?", (self.store.key(key),))
