"""The dead-letter index on SQLite: one table, an index per filter
(:mod:`jobsystem.store.dead_letter_index`)."""

from __future__ import annotations

from typing import Any

from jobsystem.store.dead_letter_index import DeadLetterEntry, DeadLetterFilter, IndexBackend, IndexPage
from jobsystem.store.sorted_index import Cursor
from jobsystem.store.sqlite import SqliteStore

__all__ = ["SqliteIndex"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS dead_letter_index (
    id INTEGER PRIMARY KEY,
    ns TEXT NOT NULL,
    queue TEXT NOT NULL,
    message_id TEXT NOT NULL,
    actor TEXT NOT NULL,
    reason TEXT NOT NULL,
    exception TEXT NOT NULL,
    error TEXT NOT NULL,
    traceback TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    enqueued_at INTEGER,
    failed_at INTEGER NOT NULL,
    copies INTEGER NOT NULL,
    replays INTEGER,
    UNIQUE (ns, queue, message_id)
);
ALTER TABLE dead_letter_index ADD COLUMN replays INTEGER;
CREATE INDEX IF NOT EXISTS dead_letter_index_all ON dead_letter_index (ns, failed_at);
CREATE INDEX IF NOT EXISTS dead_letter_index_q ON dead_letter_index (ns, queue, failed_at);
CREATE INDEX IF NOT EXISTS dead_letter_index_a ON dead_letter_index (ns, actor, failed_at);
CREATE INDEX IF NOT EXISTS dead_letter_index_e ON dead_letter_index (ns, exception, failed_at)
"""

_COLUMNS = (
    "queue, message_id, actor, reason, exception, error, traceback, attempts, enqueued_at, failed_at, copies,"
    " replays"
)


def _counts(e: DeadLetterEntry) -> tuple[int, int | None, int, int | None]:
    return e.attempts, e.enqueued_at, e.failed_at, e.replays


def _entry(row: tuple[Any, ...]) -> DeadLetterEntry:
    return DeadLetterEntry(*row)


class SqliteIndex(IndexBackend):
    def __init__(self, store: SqliteStore) -> None:
        self.store = store
        store.ensure_schema(_SCHEMA)

    def add(self, entries: list[DeadLetterEntry], *, ttl_ms: int | None, max_length: int | None) -> None:
        if not entries:
            return
        ns = self.store.namespace
        with self.store.transaction() as conn:
            for e in entries:
                conn.execute(
                    f"INSERT INTO dead_letter_index (ns, {_COLUMNS}) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?) "
                    "ON CONFLICT (ns, queue, message_id) DO UPDATE SET actor = excluded.actor, "
                    "reason = excluded.reason, exception = excluded.exception, error = excluded.error, "
                    "traceback = excluded.traceback, attempts = excluded.attempts, "
                    "enqueued_at = excluded.enqueued_at, failed_at = excluded.failed_at, "
                    "copies = copies + 1, replays = excluded.replays",
                    (
                        ns,
                        e.queue,
                        e.message_id,
                        e.actor,
                        e.reason,
                        e.exception,
                        e.error,
                        e.traceback,
                        *_counts(e),
                    ),
                )
            if ttl_ms:
                conn.execute(
                    "DELETE FROM dead_letter_index WHERE ns = ? AND failed_at <= ?",
                    (ns, self.store.now_ms() - ttl_ms),
                )
            for queue in {e.queue for e in entries} if max_length else ():
                conn.execute(
                    "DELETE FROM dead_letter_index WHERE id IN (SELECT id FROM dead_letter_index "
                    "WHERE ns = ? AND queue = ? ORDER BY failed_at DESC, id DESC LIMIT -1 OFFSET ?)",
                    (ns, queue, max_length),
                )

    def remove(self, items: list[tuple[str, str]]) -> None:
        if not items:
            return
        rows = [(self.store.namespace, queue, message_id) for queue, message_id in items]
        with self.store.transaction() as conn:
            conn.executemany(
                "UPDATE dead_letter_index SET copies = copies - 1 "
                "WHERE ns = ? AND queue = ? AND message_id = ?",
                rows,
            )
            conn.execute("DELETE FROM dead_letter_index WHERE copies <= 0")

    def clear(self, queue: str) -> None:
        with self.store.transaction() as conn:
            conn.execute(
                "DELETE FROM dead_letter_index WHERE ns = ? AND queue = ?", (self.store.namespace, queue)
            )

    def replace(self, queue: str, entries: list[DeadLetterEntry], chunk: int = 500) -> None:
        """Make ``entries`` the whole index of ``queue`` in one transaction: a store that fails
        part-way leaves the index as it was."""
        with self.store.transaction():  # the clear and each chunk's add join it
            super().replace(queue, entries, chunk)

    def get(self, queue: str, message_id: str) -> DeadLetterEntry | None:
        rows = self.store.rows(
            f"SELECT {_COLUMNS} FROM dead_letter_index WHERE ns = ? AND queue = ? AND message_id = ?",
            (self.store.namespace, queue, message_id),
        )
        return _entry(rows[0]) if rows else None

    def page(self, dl_filter: DeadLetterFilter, cursor: Cursor | None, limit: int) -> IndexPage:
        clauses, params = ["ns = ?"], list[Any]([self.store.namespace])
        for column in ("queue", "actor", "exception"):
            value = getattr(dl_filter, column)
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        if dl_filter.since is not None:
            clauses.append("failed_at >= ?")
            params.append(dl_filter.since)
        if cursor is not None:
            clauses.append("(failed_at, id) < (?, ?)")
            params += [cursor.at, cursor.seq]
        rows = self.store.rows(
            f"SELECT {_COLUMNS}, id FROM dead_letter_index WHERE {' AND '.join(clauses)} "
            "ORDER BY failed_at DESC, id DESC LIMIT ?",
            (*params, limit + 1),
        )
        entries = [_entry(row[:-1]) for row in rows[:limit]]
        last = rows[limit - 1] if len(rows) > limit else None
        return IndexPage(entries, Cursor(int(last[9]), str(last[-1])) if last else None)

    def counts(self) -> dict[str, int]:
        rows = self.store.rows(
            "SELECT queue, SUM(copies) FROM dead_letter_index WHERE ns = ? GROUP BY queue",
            (self.store.namespace,),
        )
        return {str(queue): int(count) for queue, count in rows}

    def facets(self) -> dict[str, list[str]]:
        ns = (self.store.namespace,)
        actors = self.store.rows("SELECT DISTINCT actor FROM dead_letter_index WHERE ns = ?", ns)
        exceptions = self.store.rows("SELECT DISTINCT exception FROM dead_letter_index WHERE ns = ?", ns)
        return {"actor": sorted(a for (a,) in actors), "exception": sorted(e for (e,) in exceptions)}
