"""Idempotency keys in SQLite: the same transitions as the Redis scripts
(``jobsystem.store.idempotency``, where the contract is described), each in one ``BEGIN IMMEDIATE``
transaction."""

from __future__ import annotations

from jobsystem.store.idempotency import KEY_PREFIX, Claim, ClaimRequest, IdempotencyBackend, KeyRecord
from jobsystem.store.sqlite import SqliteStore

__all__ = ["SqliteIdempotency"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS idempotency (
    key TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    message_id TEXT,
    owner TEXT,
    lease_until INTEGER,
    result TEXT,
    expires_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS idempotency_expires ON idempotency (expires_at)
"""


class SqliteIdempotency(IdempotencyBackend):
    """Keys as rows of one table; every read-then-write runs in a ``BEGIN IMMEDIATE`` transaction."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store
        store.ensure_schema(_SCHEMA)

    def _live(
        self, conn: object, key: str, now: int
    ) -> tuple[str, str | None, str | None, int | None, str | None] | None:
        import sqlite3

        assert isinstance(conn, sqlite3.Connection)
        row = conn.execute(
            "SELECT state, message_id, owner, lease_until, result FROM idempotency "
            "WHERE key = ? AND expires_at > ?",
            (self.store.key(KEY_PREFIX + key), now),
        ).fetchone()
        return tuple(row) if row else None

    def register(self, key: str, message_id: str, ttl_ms: int) -> str | None:
        now = self.store.now_ms()
        with self.store.transaction() as conn:
            row = self._live(conn, key, now)
            if row is not None:
                return row[1]
            conn.execute(
                "INSERT OR REPLACE INTO idempotency (key, state, message_id, expires_at) "
                "VALUES (?, 'pending', ?, ?)",
                (self.store.key(KEY_PREFIX + key), message_id, now + ttl_ms),
            )
            return None

    def register_many(self, items: list[tuple[str, str, int]]) -> list[str | None]:
        """All the keys in one transaction."""
        with self.store.transaction():
            return [self.register(key, message_id, ttl) for key, message_id, ttl in items]

    def claim_many(self, requests: list[ClaimRequest]) -> list[Claim]:
        """All the requests in one transaction."""
        with self.store.transaction():
            return [self._claim_one(r) for r in requests]

    def _claim_one(self, request: ClaimRequest) -> Claim:
        key, owner, lease_ms, ttl_ms = request.key, request.owner, request.lease_ms, request.ttl_ms
        now = self.store.now_ms()
        with self.store.transaction() as conn:
            row = self._live(conn, key, now)
            mid = (row[1] if row else None) or request.message_id
            if row is not None and row[0] == "done":
                return Claim("completed", 0, row[4], mid)
            if row is not None and row[0] == "running" and row[2] != owner and (row[3] or 0) > now:
                return Claim("held", (row[3] or 0) - now, None, mid)
            conn.execute(
                "INSERT INTO idempotency (key, state, message_id, owner, lease_until, expires_at) "
                "VALUES (?, 'running', ?, ?, ?, ?) ON CONFLICT(key) DO UPDATE SET state = 'running', "
                "message_id = excluded.message_id, owner = excluded.owner, "
                "lease_until = excluded.lease_until, "
                "expires_at = MAX(idempotency.expires_at, excluded.expires_at)",
                (self.store.key(KEY_PREFIX + key), mid, owner, now + lease_ms, now + ttl_ms),
            )
            return Claim("claimed", 0, None, mid)

    def renew(self, claims: list[tuple[str, str]], lease_ms: int) -> None:
        if claims:
            until = self.store.now_ms() + lease_ms
            with self.store.transaction() as conn:
                conn.executemany(
                    "UPDATE idempotency SET lease_until = ? "
                    "WHERE key = ? AND owner = ? AND state = 'running'",
                    [(until, self.store.key(KEY_PREFIX + key), owner) for key, owner in claims],
                )

    def complete_many(self, items: list[tuple[str, str | None, int]]) -> None:
        now = self.store.now_ms()
        with self.store.transaction() as conn:
            # Upserted, as on Redis: a key whose record expired or went while its job ran is
            # still remembered as done (a later duplicate is skipped, not run again).
            conn.executemany(
                "INSERT INTO idempotency (key, state, result, expires_at) VALUES (?, 'done', ?, ?) "
                "ON CONFLICT(key) DO UPDATE SET state = 'done', result = excluded.result, owner = NULL, "
                "lease_until = NULL, expires_at = excluded.expires_at",
                [(self.store.key(KEY_PREFIX + key), result, now + ttl) for key, result, ttl in items],
            )

    def release_many(self, claims: list[tuple[str, str]]) -> None:
        with self.store.transaction() as conn:
            conn.executemany(
                "UPDATE idempotency SET state = 'pending', owner = NULL, lease_until = NULL "
                "WHERE key = ? AND owner = ? AND state = 'running'",
                [(self.store.key(KEY_PREFIX + key), owner) for key, owner in claims],
            )

    def unregister_many(self, items: list[tuple[str, str]]) -> None:
        with self.store.transaction() as conn:
            conn.executemany(
                "DELETE FROM idempotency WHERE key = ? AND message_id = ? AND state = 'pending'",
                [(self.store.key(KEY_PREFIX + key), message_id) for key, message_id in items],
            )

    def keep_many(self, items: list[tuple[str, int]]) -> None:
        now = self.store.now_ms()
        with self.store.transaction() as conn:
            conn.executemany(
                "UPDATE idempotency SET expires_at = MAX(expires_at, ?) WHERE key = ? AND expires_at > ?",
                [(now + ttl, self.store.key(KEY_PREFIX + key), now) for key, ttl in items],
            )

    def forget_many(self, keys: list[str]) -> None:
        with self.store.transaction() as conn:
            conn.executemany(
                "DELETE FROM idempotency WHERE key = ? AND state != 'done'",
                [(self.store.key(KEY_PREFIX + key),) for key in keys],
            )

    def lookup(self, key: str) -> KeyRecord | None:
        with self.store.transaction() as conn:
            row = self._live(conn, key, self.store.now_ms())
        return KeyRecord(row[0], row[1], row[4]) if row else None
