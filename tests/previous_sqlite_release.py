"""The SQLite workflow writes of the previous release, as its SQL did them: what one of its workers
(a member's end) or senders (a new workflow) does to a state file this release shares. It counts
a step's rows, not ``n:<step>``; gives every row of a workflow the longest expiry among them on
each write; and sweeps the rows past their own expiry before it records a new workflow."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import Any

from jobsystem.store.sqlite import SqliteStore
from jobsystem.store.workflows import initial_fields

__all__ = ["create", "finish"]


def _put(
    conn: sqlite3.Connection, store: SqliteStore, wid: str, values: Mapping[str, str], ttl_ms: int
) -> None:
    """Write ``values``, then give every row of the workflow the longest expiry among them."""
    (longest,) = conn.execute("SELECT MAX(expires_at) FROM workflow_fields WHERE wid = ?", (wid,)).fetchone()
    expires = max(store.now_ms() + ttl_ms, longest or 0)
    conn.executemany(
        "INSERT INTO workflow_fields (wid, field, value, expires_at) VALUES (?, ?, ?, ?) "
        "ON CONFLICT(wid, field) DO UPDATE SET value = excluded.value, expires_at = excluded.expires_at",
        [(wid, k, v, expires) for k, v in values.items()],
    )
    conn.execute("UPDATE workflow_fields SET expires_at = ? WHERE wid = ?", (expires, wid))


def create(store: SqliteStore, record: dict[str, Any], ttl_ms: int) -> None:
    """Sweep the expired rows, then record a new workflow, every row expiring in ``ttl_ms``."""
    now = store.now_ms()
    with store.transaction() as conn:
        expired = "SELECT wid FROM workflow_fields WHERE expires_at <= ? AND field = 'record'"
        conn.execute(f"DELETE FROM workflow_done WHERE wid IN ({expired})", (now,))
        conn.execute("DELETE FROM workflow_fields WHERE expires_at <= ?", (now,))
        _put(conn, store, store.key(record["id"]), initial_fields(record), ttl_ms)


def finish(store: SqliteStore, workflow_id: str, member: str, result: str, ttl_ms: int) -> None:
    """Count ``member`` of step 0 as succeeded with ``result``, as a step's member that is not its
    last: its row in ``workflow_done``, its state and result, the count of its state."""
    wid = store.key(workflow_id)
    with store.transaction() as conn:
        conn.execute("INSERT OR IGNORE INTO workflow_done VALUES (?, 0, ?)", (wid, member))
        counted = conn.execute(
            "SELECT value FROM workflow_fields WHERE wid = ? AND field = 'c:0:succeeded'", (wid,)
        ).fetchall()
        values = {f"s:{member}": "succeeded", f"r:{member}": result}
        values["c:0:succeeded"] = str(int(counted[0][0] if counted else 0) + 1)
        _put(conn, store, wid, values, ttl_ms)
