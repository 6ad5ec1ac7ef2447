"""Workflows on SQLite: the operations of :mod:`jobsystem.store.workflows` as rows, each
read-then-write in one ``BEGIN IMMEDIATE`` transaction. The table ``workflow_fields`` holds the
fields a Redis hash would, one row each; ``workflow_done`` the members counted, per step."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import Any

from jobsystem.store.sqlite import SqliteStore
from jobsystem.store.workflows import (
    StepProgress,
    WorkflowBackend,
    WorkflowRecord,
    initial_fields,
    parse_fields,
)

__all__ = ["SqliteWorkflows"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS workflow_fields (
    wid TEXT NOT NULL,
    field TEXT NOT NULL,
    value TEXT NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (wid, field)
);
CREATE TABLE IF NOT EXISTS workflow_done (
    wid TEXT NOT NULL,
    step INTEGER NOT NULL,
    member TEXT NOT NULL,
    PRIMARY KEY (wid, step, member)
);
CREATE INDEX IF NOT EXISTS workflow_fields_expiry ON workflow_fields (expires_at)
"""


class SqliteWorkflows(WorkflowBackend):
    """The same operations as rows; each read-then-write in one ``BEGIN IMMEDIATE`` transaction."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store
        store.ensure_schema(_SCHEMA)

    def _wid(self, workflow_id: str) -> str:
        return self.store.key(workflow_id)

    def _fields(self, conn: sqlite3.Connection, workflow_id: str) -> dict[str, str]:
        rows = conn.execute(
            "SELECT field, value FROM workflow_fields WHERE wid = ? AND expires_at > ?",
            (self._wid(workflow_id), self.store.now_ms()),
        ).fetchall()
        return {f: v for f, v in rows}

    def _put(
        self, conn: sqlite3.Connection, workflow_id: str, values: Mapping[str, str], ttl_ms: int
    ) -> None:
        """Write ``values``; the workflow lives ``ttl_ms`` more, never less than it already did (a
        member delayed past the TTL, or a delayed next step, must still find it)."""
        (longest,) = conn.execute(
            "SELECT MAX(expires_at) FROM workflow_fields WHERE wid = ?", (self._wid(workflow_id),)
        ).fetchone()
        expires = max(self.store.now_ms() + ttl_ms, longest or 0)
        conn.executemany(
            "INSERT INTO workflow_fields (wid, field, value, expires_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(wid, field) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at",
            [(self._wid(workflow_id), k, v, expires) for k, v in values.items()],
        )
        conn.execute(
            "UPDATE workflow_fields SET expires_at = ? WHERE wid = ?", (expires, self._wid(workflow_id))
        )

    def create(self, record: dict[str, Any], ttl_ms: int) -> None:
        with self.store.transaction() as conn:
            self._sweep(conn)
            self._put(conn, record["id"], initial_fields(record), ttl_ms)

    def _sweep(self, conn: sqlite3.Connection) -> None:
        """Delete the expired workflows' rows (a workflow's rows expire together): nothing else
        would, and every member's state and result would stay in the file for good."""
        now = self.store.now_ms()
        conn.execute(
            "DELETE FROM workflow_done WHERE wid IN "
            "(SELECT wid FROM workflow_fields WHERE expires_at <= ? AND field = 'record')",
            (now,),
        )
        conn.execute("DELETE FROM workflow_fields WHERE expires_at <= ?", (now,))

    def finish(
        self,
        workflow_id: str,
        step: int,
        member: str,
        state: str,
        result: str,
        ttl_ms: int,
        reason: str = "",
    ) -> StepProgress:
        with self.store.transaction() as conn:
            fields = self._fields(conn, workflow_id)
            if "record" not in fields:
                return StepProgress("unknown", False, 0, 0)
            added = (
                conn.execute(
                    "INSERT OR IGNORE INTO workflow_done (wid, step, member) VALUES (?, ?, ?)",
                    (self._wid(workflow_id), step, member),
                ).rowcount
                > 0
            )
            updates: dict[str, str] = {}
            if added:
                counter = f"c:{step}:{state}"
                updates.update({f"s:{member}": state, f"r:{member}": result})
                if reason:
                    updates[f"e:{member}"] = reason
                updates[counter] = str(int(fields.get(counter, "0")) + 1)
                if (
                    state != "succeeded"
                    and fields.get(f"mode:{step}") != "finished"
                    and fields["state"] == "running"
                ):
                    updates.update({"state": "failed", "failed": member})
            fields.update(updates)
            finished = conn.execute(
                "SELECT COUNT(*) FROM workflow_done WHERE wid = ? AND step = ?",
                (self._wid(workflow_id), step),
            ).fetchone()[0]
            size = int(fields[f"size:{step}"])
            if added and finished >= size and f"by:{step}" not in fields:
                updates[f"by:{step}"] = fields[f"by:{step}"] = member
            if finished >= size and step == int(fields["steps"]) - 1 and fields["state"] == "running":
                updates["state"] = fields["state"] = "succeeded"
            self._put(conn, workflow_id, updates, ttl_ms)
        counts = {s: int(fields.get(f"c:{step}:{s}", "0")) for s in ("succeeded", "dead", "cancelled")}
        completer = finished >= size and fields.get(f"by:{step}", member) == member
        return StepProgress(
            fields["state"], added, int(finished), size, counts, f"sent:{step}" in fields, completer
        )

    def mark_sent(self, workflow_id: str, step: int, ttl_ms: int) -> None:
        with self.store.transaction() as conn:
            self._put(conn, workflow_id, {f"sent:{step}": "1"}, ttl_ms)

    def get(self, workflow_id: str) -> WorkflowRecord | None:
        with self.store.transaction() as conn:
            return parse_fields(self._fields(conn, workflow_id))

    def set_state(self, workflow_id: str, state: str, *, only_from: str = "running") -> bool:
        with self.store.transaction() as conn:
            cursor = conn.execute(
                "UPDATE workflow_fields SET value = ? WHERE wid = ? AND field = 'state' AND value = ?",
                (state, self._wid(workflow_id), only_from),
            )
            return cursor.rowcount > 0
