"""Workflows on SQLite: the operations of :mod:`jobsystem.store.workflows` as rows, each
read-then-write in one ``BEGIN IMMEDIATE`` transaction. The tables and their triggers are in
:mod:`jobsystem.store.workflows_sqlite_schema`.

Counting a member's end costs the same whatever the workflow's size: it reads the few fields of
its step by primary key (never the members' rows), reads the step's finished members from the
field ``n:<step>`` (not ``COUNT(*)``), which a trigger keeps as members are counted, whichever
release counts them, and only the ``record`` row carries the workflow's expiry (every other row
is written with :data:`FOLLOWS`, kept as long as its workflow), so lengthening the workflow's life
rewrites one row, not one per member. Reading or finishing every member of a 10,000-member group
was quadratic before. Workers and senders of the previous release may write to the same file: the
triggers keep the counter, the record's expiry and the other rows' :data:`FOLLOWS` right."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import Any

from jobsystem.store.cancel_marks import cancel_marks, sqlite_marked
from jobsystem.store.sqlite import SqliteStore
from jobsystem.store.workflows import (
    StepProgress,
    WorkflowBackend,
    WorkflowRecord,
    initial_fields,
    parse_fields,
)
from jobsystem.store.workflows_sqlite_schema import FOLLOWS, SCHEMA

__all__ = ["SqliteWorkflows"]


class SqliteWorkflows(WorkflowBackend):
    """The same operations as rows; each read-then-write in one ``BEGIN IMMEDIATE`` transaction."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store
        store.ensure_schema(SCHEMA)
        self.marks = cancel_marks(store)  # its table: read in finish's transaction

    def _wid(self, workflow_id: str) -> str:
        return self.store.key(workflow_id)

    def _expiry(self, conn: sqlite3.Connection, workflow_id: str) -> int | None:
        """When the workflow expires (its ``record`` row's), or None when unknown or expired."""
        row = conn.execute(
            "SELECT expires_at FROM workflow_fields WHERE wid = ? AND field = 'record' AND expires_at > ?",
            (self._wid(workflow_id), self.store.now_ms()),
        ).fetchone()
        return None if row is None else int(row[0])

    def _fields(self, conn: sqlite3.Connection, workflow_id: str, names: list[str]) -> dict[str, str]:
        """The fields ``names`` of a live workflow, each found by primary key."""
        marks = ",".join("?" * len(names))
        rows = conn.execute(
            f"SELECT field, value FROM workflow_fields WHERE wid = ? AND field IN ({marks})",
            (self._wid(workflow_id), *names),
        ).fetchall()
        return {f: v for f, v in rows}

    def _put(
        self,
        conn: sqlite3.Connection,
        workflow_id: str,
        values: Mapping[str, str],
        ttl_ms: int,
        expiry: int,
    ) -> None:
        """Write ``values``; the workflow (expiring at ``expiry``) lives ``ttl_ms`` more, never
        less than it already did (a member delayed past the TTL, or a delayed next step, must
        still find it). Only the ``record`` row's expiry changes; the others follow it (a row
        written before has :data:`FOLLOWS` already: the schema's triggers see to it)."""
        wid = self._wid(workflow_id)
        conn.executemany(
            "INSERT INTO workflow_fields (wid, field, value, expires_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(wid, field) DO UPDATE SET value = excluded.value",
            [(wid, k, v, FOLLOWS) for k, v in values.items()],
        )
        conn.execute(
            "UPDATE workflow_fields SET expires_at = ? WHERE wid = ? AND field = 'record'",
            (max(self.store.now_ms() + ttl_ms, expiry), wid),
        )

    def create(self, record: dict[str, Any], ttl_ms: int) -> bool:
        with self.store.transaction() as conn:
            self._sweep(conn)
            if self._expiry(conn, record["id"]) is not None:
                return False  # a relaunch: see WorkflowBackend.create
            # ``ttl``: how much a write of the previous release lengthens its life (the triggers)
            self._put(conn, record["id"], {**initial_fields(record), "ttl": str(ttl_ms)}, ttl_ms, 0)
            return True

    def _sweep(self, conn: sqlite3.Connection) -> None:
        """Delete the expired workflows' rows: nothing else would, and every member's state and
        result would stay in the file for good. Only a ``record`` row expires (and a row an
        earlier release left without one); the trigger ``workflow_record_deleted`` deletes the
        rest of its workflow with it."""
        conn.execute("DELETE FROM workflow_fields WHERE expires_at <= ?", (self.store.now_ms(),))

    def finish(
        self,
        workflow_id: str,
        step: int,
        member: str,
        state: str,
        result: str,
        ttl_ms: int,
        reason: str = "",
        *,
        replayed: bool = False,
    ) -> StepProgress:
        with self.store.transaction() as conn:
            expiry = self._expiry(conn, workflow_id)
            if expiry is None:
                return StepProgress("unknown", False, 0, 0)
            if state == "succeeded" and sqlite_marked(conn, self.store, member, workflow_id):
                state = "cancelled"  # cancelled while it ran: see WorkflowBackend.finish
            added = (  # and counted in n:<step> by the trigger workflow_done_counted
                conn.execute(
                    "INSERT OR IGNORE INTO workflow_done (wid, step, member) VALUES (?, ?, ?)",
                    (self._wid(workflow_id), step, member),
                ).rowcount
                > 0
            )
            names = _step_fields(step, state) + ([f"s:{member}", "failed"] if replayed else [])
            fields = self._fields(conn, workflow_id, names)
            updates = _member_updates(fields, step, member, state, result, reason) if added else {}
            if not added and replayed and state == "succeeded" and fields.get(f"s:{member}") == "dead":
                updates = self._replay_updates(conn, workflow_id, fields, step, member, result)
            fields.update(updates)
            finished = int(fields.get(f"n:{step}", "0"))
            size = int(fields[f"size:{step}"])
            if added and finished >= size and f"by:{step}" not in fields:
                updates[f"by:{step}"] = fields[f"by:{step}"] = member
            if finished >= size and step == int(fields["steps"]) - 1 and fields["state"] == "running":
                updates["state"] = fields["state"] = "succeeded"
            self._put(conn, workflow_id, updates, ttl_ms, expiry)
        counts = {s: int(fields.get(f"c:{step}:{s}", "0")) for s in ("succeeded", "dead", "cancelled")}
        completer = finished >= size and fields.get(f"by:{step}", member) == member
        return StepProgress(
            fields["state"], added, finished, size, counts, f"sent:{step}" in fields, completer
        )

    def _replay_updates(
        self,
        conn: sqlite3.Connection,
        workflow_id: str,
        fields: dict[str, str],
        step: int,
        member: str,
        result: str,
    ) -> dict[str, str]:
        """A dead member replayed that succeeded: counted again (see :meth:`WorkflowBackend.finish`)."""
        dead, succeeded = f"c:{step}:dead", f"c:{step}:succeeded"
        updates = {
            f"s:{member}": "succeeded",
            f"r:{member}": result,
            dead: str(int(fields.get(dead, "1")) - 1),
            succeeded: str(int(fields.get(succeeded, "0")) + 1),
        }
        if fields["state"] != "failed" or fields.get("failed") != member:
            return updates
        other = conn.execute(_UNSUCCEEDED, (self._wid(workflow_id), step, member)).fetchone()
        if other is not None:
            updates["failed"] = other[0]
            return updates
        updates.update({"state": "running", "failed": ""})
        if int(fields.get(f"n:{step}", "0")) >= int(fields[f"size:{step}"]):
            updates[f"by:{step}"] = member
        return updates

    def fail_member(self, workflow_id: str, step: int, member: str, reason: str, ttl_ms: int) -> None:
        with self.store.transaction() as conn:
            expiry = self._expiry(conn, workflow_id)
            if expiry is None:
                return
            was_field = f"s:{member}"
            fields = self._fields(conn, workflow_id, ["state", was_field, *_counters(step, "failed")])
            updates = {was_field: "failed", f"e:{member}": reason}
            was = fields.get(was_field)
            if was != "failed":
                failed = f"c:{step}:failed"
                updates[failed] = str(int(fields.get(failed, "0")) + 1)
                if was:
                    updates[f"c:{step}:{was}"] = str(int(fields.get(f"c:{step}:{was}", "1")) - 1)
            if fields.get("state") == "running":
                updates.update({"state": "failed", "failed": member})
            self._put(conn, workflow_id, updates, ttl_ms, expiry)

    def keep(self, workflow_id: str, step: int, ttl_ms: int) -> None:
        # The members' rows follow the record's expiry (FOLLOWS): one row to lengthen.
        with self.store.transaction() as conn:
            expiry = self._expiry(conn, workflow_id)
            if expiry is not None:
                self._put(conn, workflow_id, {}, ttl_ms, expiry)

    def mark_sent(self, workflow_id: str, step: int, ttl_ms: int) -> None:
        with self.store.transaction() as conn:
            expiry = self._expiry(conn, workflow_id)
            if expiry is not None:  # gone: nothing to note, and no row left behind for good
                self._put(conn, workflow_id, {f"sent:{step}": "1"}, ttl_ms, expiry)

    def get(self, workflow_id: str) -> WorkflowRecord | None:
        with self.store.transaction() as conn:
            if self._expiry(conn, workflow_id) is None:
                return None
            rows = conn.execute(
                "SELECT field, value FROM workflow_fields WHERE wid = ?", (self._wid(workflow_id),)
            ).fetchall()
            return parse_fields({f: v for f, v in rows})

    def set_state(self, workflow_id: str, state: str, *, only_from: str = "running") -> bool:
        with self.store.transaction() as conn:
            cursor = conn.execute(
                "UPDATE workflow_fields SET value = ? WHERE wid = ? AND field = 'state' AND value = ?",
                (state, self._wid(workflow_id), only_from),
            )
            return cursor.rowcount > 0

    def _cancelled(
        self, ids: list[str], pairs: list[tuple[str, str]]
    ) -> tuple[set[str], set[tuple[str, str]]]:
        marked = self.marks.cancelled_among([*ids, *pairs])  # a pair: by id, or its own mark
        now = self.store.now_ms()
        stopped = {p for p in pairs if p in marked}
        for member, workflow_id in pairs:
            # Only while the workflow's record lives: an expired workflow's rows may not be swept yet.
            rows = self.store.rows(_MEMBER_STOPPED, (f"s:{member}", self._wid(workflow_id), now))
            if rows and rows[0][0] == "cancelled" and rows[0][1] in (None, "cancelled"):
                stopped.add((member, workflow_id))
        return {i for i in ids if i in marked}, stopped


#: A workflow's state and a member's final state in it (NULL: not counted), if its record lives.
_MEMBER_STOPPED = """
SELECT s.value, m.value FROM workflow_fields AS r
JOIN workflow_fields AS s ON s.wid = r.wid AND s.field = 'state'
LEFT JOIN workflow_fields AS m ON m.wid = r.wid AND m.field = ?
WHERE r.wid = ? AND r.field = 'record' AND r.expires_at > ?
"""


#: Another member of a step counted as ended otherwise than succeeded, if one is.
_UNSUCCEEDED = """
SELECT d.member FROM workflow_done AS d
JOIN workflow_fields AS f ON f.wid = d.wid AND f.field = 's:' || d.member
WHERE d.wid = ? AND d.step = ? AND d.member != ? AND f.value != 'succeeded' LIMIT 1
"""


def _step_fields(step: int, state: str) -> list[str]:
    """The fields :meth:`SqliteWorkflows.finish` reads: the workflow's state and the step's own."""
    return [
        "state",
        "steps",
        f"size:{step}",
        f"mode:{step}",
        f"by:{step}",
        f"sent:{step}",
        f"n:{step}",
        *_counters(step, state),
    ]


def _counters(step: int, state: str) -> list[str]:
    """The names of ``step``'s counters of the states an end is reported in, and of ``state``."""
    return [f"c:{step}:{s}" for s in ("succeeded", "dead", "cancelled", state)]


def _member_updates(
    fields: dict[str, str], step: int, member: str, state: str, result: str, reason: str
) -> dict[str, str]:
    """The fields a member counted for the first time changes: its state, result and reason, its
    step's counter of ``state``, and the workflow's state when it fails a step that needs success."""
    counter = f"c:{step}:{state}"
    updates = {f"s:{member}": state, f"r:{member}": result, counter: str(int(fields.get(counter, "0")) + 1)}
    if reason:
        updates[f"e:{member}"] = reason
    if state != "succeeded" and fields.get(f"mode:{step}") != "finished" and fields["state"] == "running":
        updates.update({"state": "failed", "failed": member})
    return updates
