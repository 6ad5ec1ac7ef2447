"""Counting a member's end on SQLite costs the same in a workflow of 50 members as in one of
1,000: measured in SQLite virtual machine steps (a count of the rows read and written, which
repeats run to run), never in time. Each finish read every field of its workflow (one row per
member), counted the step's rows and rewrote every row's expiry: finishing a group was quadratic."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jobsystem.store.sqlite import SqliteStore
from jobsystem.store.workflows import workflow_backend

TTL = 60_000


def group_record(workflow_id: str, size: int) -> dict[str, Any]:
    members = [{"id": f"m{i}", "actor": "a", "queue": "q"} for i in range(size)]
    return {
        "id": workflow_id,
        "kind": "chord",
        "steps": [
            {"mode": "success", "members": members},
            {"mode": "success", "members": [{"id": "next", "actor": "b", "queue": "q"}]},
        ],
    }


def steps_of_a_late_finish(store: SqliteStore, size: int) -> int:
    """The VM steps of finishing the last but one member of a ``size``-member step, all members
    before it finished (each with a result)."""
    backend = workflow_backend(store)
    backend.create(group_record(f"wf{size}", size), TTL)
    for i in range(size - 2):
        backend.finish(f"wf{size}", 0, f"m{i}", "succeeded", '"a result"', TTL)
    steps = [0]

    def count() -> int:
        steps[0] += 1
        return 0  # carry on

    conn = store.connection()
    conn.set_progress_handler(count, 1)
    try:
        progress = backend.finish(f"wf{size}", 0, f"m{size - 2}", "succeeded", '"a result"', TTL)
    finally:
        conn.set_progress_handler(None, 1)
    assert (progress.added, progress.finished, progress.complete) == (True, size - 1, False)
    return steps[0]


def test_finishing_a_member_does_not_grow_with_the_workflow(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    try:
        small, large = steps_of_a_late_finish(store, 50), steps_of_a_late_finish(store, 1_000)
    finally:
        store.close()
    # O(log n) index descents only: 20 times the members, not 20 times the work (it was ~19x).
    assert large < small * 1.3, (small, large)


def test_a_step_counted_by_an_earlier_release_is_counted_from_its_rows(tmp_path: Path) -> None:
    """An in-flight workflow across the upgrade: its step has no ``n:<step>`` counter."""
    store = SqliteStore(tmp_path / "state.db")
    backend = workflow_backend(store)
    backend.create(group_record("old", 3), TTL)
    backend.finish("old", 0, "m0", "succeeded", "0", TTL)
    backend.finish("old", 0, "m1", "succeeded", "1", TTL)
    with store.transaction() as conn:
        conn.execute("DELETE FROM workflow_fields WHERE field = 'n:0'")
        conn.execute("UPDATE workflow_fields SET expires_at = 1 WHERE field = 's:m0'")  # old expiry
    last = backend.finish("old", 0, "m2", "succeeded", "4", TTL)
    assert (last.finished, last.complete, last.send_next) == (3, True, True)
    found = backend.get("old")
    assert found is not None and found.step_results(0) == [0, 1, 4]  # each row kept with the record
    store.close()
