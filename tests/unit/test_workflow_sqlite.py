"""Counting a member's end on SQLite costs the same in a workflow of 50 members as in one of
1,000: measured in SQLite virtual machine steps (a count of the rows read and written, which
repeats run to run), never in time. Each finish read every field of its workflow (one row per
member), counted the step's rows and rewrote every row's expiry: finishing a group was quadratic.
And the counter is kept by a trigger in the file, so a worker of the previous release (which
counts rows) beside this one, and a file of the previous release, count right."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import dramatiq

from jobsystem.runtime.workflow_steps import Step, annotate
from jobsystem.store.sqlite import SqliteStore
from jobsystem.store.workflows import workflow_backend
from jobsystem.store.workflows_sqlite_schema import FOLLOWS, TABLES
from middleware.workflows import Workflows
from tests import previous_sqlite_release as previous
from tests.support import wait_for
from tests.unit.stub import RecordingBroker, delivery

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


def test_a_member_counted_by_a_worker_of_the_previous_release_completes_its_step(tmp_path: Path) -> None:
    """Workers of both releases on one file: the counter was kept by this release's code only, so
    a member counted by the previous release left the step one short and the chord's next step
    was never sent."""
    store = SqliteStore(tmp_path / "state.db")
    workflows = Workflows(store, ttl_ms=TTL, cancel_ttl_ms=TTL)
    broker = RecordingBroker(middleware=[workflows])
    square = dramatiq.actor(broker=broker, actor_name="square", queue_name="q")(lambda i: i * i)
    total = dramatiq.actor(broker=broker, actor_name="total", queue_name="q")(sum)
    record, first = annotate(
        "chord",
        [Step([square.message(i) for i in range(3)], pipe="list"), Step([total.message_with_options()])],
    )
    workflows.backend.create(record, TTL)
    workflows.after_process_message(broker, delivery(first[0]), result=0)
    previous.finish(store, record["id"], first[1].message_id, "1", TTL)
    workflows.after_process_message(broker, delivery(first[2]), result=4)
    assert [(m.actor_name, m.args) for m, _ in broker.enqueued] == [("total", ([0, 1, 4],))]
    store.close()


def test_a_workflow_a_previous_release_worker_wrote_to_expires_and_leaves_no_row(tmp_path: Path) -> None:
    """Only the record row carries the expiry now. The previous release wrote the longest expiry
    among the rows on every row, record included: never (the workflow was kept for good); and its
    sweep deleted the rows past their expiry, the record only (the rest were kept for good)."""
    store = SqliteStore(tmp_path / "state.db")
    backend = workflow_backend(store)
    backend.create(group_record("wf", 3), 200)
    backend.finish("wf", 0, "m0", "succeeded", '"a result"', 200)
    previous.finish(store, "wf", "m1", '"a result"', 200)
    ((expires,),) = store.rows("SELECT expires_at FROM workflow_fields WHERE field = 'record'")
    assert expires < FOLLOWS
    assert backend.finish("wf", 0, "m2", "succeeded", '"a result"', 200).send_next  # still there
    wait_for(lambda: store.now_ms() > expires, timeout=10, what="the record's expiry")
    previous.create(store, group_record("next", 1), TTL)  # sweeps first
    tables = ("workflow_fields", "workflow_done")
    assert [store.rows(f"SELECT DISTINCT wid FROM {t}") for t in tables] == [[("jobs:next",)], []]
    store.close()


def test_a_workflow_the_previous_release_created_keeps_its_fields_through_its_sweep(tmp_path: Path) -> None:
    """Recorded by a sender of the previous release (each row with its own expiry), kept alive by
    this release's count (the record row's expiry only): the previous release's sweep deleted its
    other rows at their expiry, and the next count found no step to count in."""
    store = SqliteStore(tmp_path / "state.db")
    backend = workflow_backend(store)
    previous.create(store, group_record("wf", 2), 200)
    created = store.now_ms()
    backend.finish("wf", 0, "m0", "succeeded", '"a result"', TTL)
    wait_for(lambda: store.now_ms() > created + 200, timeout=10, what="the rows' first expiry")
    previous.create(store, group_record("next", 1), TTL)  # sweeps first
    last = backend.finish("wf", 0, "m1", "succeeded", '"a result"', TTL)
    assert (last.finished, last.send_next) == (2, True)
    store.close()


def previous_release_file(path: Path) -> None:
    """A state file as the previous release left it: the tables without the trigger, two members
    of a step of three counted, and the step's counter saying 1 (the other member was counted by
    a worker of the release before it, beside it); and a step with no counter at all (counted by
    that release only); and the rows a sweep of that release left of an expired workflow."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript(TABLES)
    expires = int(time.time() * 1000) + TTL
    fields = {"record": "{}", "state": "running", "steps": "2", "size:0": "3"}
    for wid, counter in (("jobs:short", {"n:0": "1"}), ("jobs:uncounted", {})):
        rows = [(wid, k, v, expires) for k, v in {**fields, **counter}.items()]
        conn.executemany("INSERT INTO workflow_fields VALUES (?, ?, ?, ?)", rows)
        conn.executemany("INSERT INTO workflow_done VALUES (?, 0, ?)", [(wid, "m0"), (wid, "m1")])
    conn.execute("INSERT INTO workflow_fields VALUES ('jobs:left', 's:m0', 'succeeded', ?)", (FOLLOWS,))
    conn.execute("INSERT INTO workflow_done VALUES ('jobs:left', 0, 'm0')")
    conn.close()


def test_a_file_of_the_previous_release_is_upgraded_in_place_once(tmp_path: Path) -> None:
    previous_release_file(tmp_path / "state.db")
    first, second = SqliteStore(tmp_path / "state.db"), SqliteStore(tmp_path / "state.db")  # two processes
    one, other = workflow_backend(first), workflow_backend(second)
    assert one.finish("short", 0, "m0", "succeeded", "0", TTL).finished == 2  # counted before: upgraded
    last = other.finish("short", 0, "m2", "succeeded", "4", TTL)  # the schema applied again: no change
    assert (last.finished, last.complete, last.send_next) == (3, True, True)
    uncounted = one.finish("uncounted", 0, "m2", "succeeded", "4", TTL)
    assert (uncounted.finished, uncounted.send_next) == (3, True)
    tables = ("workflow_fields", "workflow_done")
    assert [first.rows(f"SELECT 1 FROM {t} WHERE wid = 'jobs:left'") for t in tables] == [[], []]
    own_expiry = "SELECT 1 FROM workflow_fields WHERE field <> 'record' AND expires_at < ?"
    assert first.rows(own_expiry, (FOLLOWS,)) == []  # each row follows its record
    ttls = first.rows("SELECT wid, CAST(value AS INTEGER) FROM workflow_fields WHERE field = 'ttl'")
    assert sorted(w for w, _ in ttls) == ["jobs:short", "jobs:uncounted"]  # once each, recorded ones
    assert all(TTL - 10_000 < ttl <= TTL for _, ttl in ttls), ttls  # no created_at: now to expiry
    triggers = "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name LIKE 'workflow%'"
    assert len(first.rows(triggers)) == 6  # the workflows' (the cancel marks have their own)
    first.close()
    second.close()


def test_a_workflow_recorded_before_the_upgrade_lives_on_while_previous_release_workers_count(
    tmp_path: Path,
) -> None:
    """Recorded by the previous release before this release upgraded the file (no ``ttl`` field),
    then counted on by previous-release workers: each count gave it the TTL from now, as each of
    this release's does. The trigger lengthens a record by its ``ttl`` field, 0 when absent: the
    record expired at its creation's TTL, members still running."""
    path = tmp_path / "state.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript(TABLES)
    conn.close()
    store = SqliteStore(path)
    previous.create(store, group_record("wf", 3), 2_000)
    created = store.now_ms()
    backend = workflow_backend(store)  # this release starts: the file is upgraded
    assert backend.get("wf") is not None
    wait_for(lambda: store.now_ms() > created + 1_000, timeout=10, what="half the TTL")
    previous.finish(store, "wf", "m0", '"a result"', 2_000)  # lives until about created + 3 s
    wait_for(lambda: store.now_ms() > created + 2_500, timeout=10, what="the creation's TTL")
    assert backend.get("wf") is not None
    store.close()


def test_a_workflow_counted_on_before_the_upgrade_keeps_at_least_the_ttl_it_was_created_with(
    tmp_path: Path,
) -> None:
    """Created with a 2 s TTL 4.5 s before the upgrade, last counted by the previous release 0.5 s
    before it: 1.5 s of life left. A count of the previous release after the upgrade gave it 2 s
    from then; its ``ttl`` is taken from its creation to its expiry (6 s), never the life left."""
    path = tmp_path / "state.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executescript(TABLES)
    conn.close()
    store = SqliteStore(path)
    record = {**group_record("wf", 3), "created_at": store.now_ms() - 4_500}
    previous.create(store, record, 1_500)  # the rows as its last count left them
    backend = workflow_backend(store)  # this release starts: the file is upgraded
    assert backend.get("wf") is not None
    counted = store.now_ms()
    previous.finish(store, "wf", "m0", '"a result"', 2_000)
    ((expires,),) = store.rows("SELECT expires_at FROM workflow_fields WHERE field = 'record'")
    assert expires >= counted + 2_000  # as long as the previous release gave it, at least
    store.close()
