"""Workflows' store backends (Redis and SQLite): a member counted once, a step completed and sent
once, a chord failed by a member, cancellation marks and their poller, results kept scrubbed."""

from __future__ import annotations

import threading

import dramatiq
import pytest
from dramatiq.results import ResultFailure

from jobsystem.store.cancel_marks import cancel_marks
from jobsystem.store.idempotency import idempotency_backend
from jobsystem.store.redis import RedisStore
from jobsystem.store.results import StoreResultBackend
from jobsystem.store.workflows import workflow_backend
from jobsystem.store.workflows_redis import RedisWorkflows
from tests.support import wait_for
from tests.unit.stub import RecordingBroker
from tests.unit.workflow_brokers import TTL, chord


def test_a_member_is_counted_once_and_the_step_completes_once(store):
    backend = workflow_backend(store)
    record, members = chord(store)
    answers = [
        backend.finish(record["id"], 0, m, "succeeded", str(i * i), TTL) for i, m in enumerate(members)
    ]
    again = backend.finish(record["id"], 0, "m1", "succeeded", "1", TTL)  # a duplicate delivery
    assert [(a.added, a.complete) for a in answers] == [(True, False), (True, False), (True, True)]
    assert (again.added, again.finished, again.state) == (False, 3, "running")
    found = backend.get(record["id"])
    assert found is not None and found.step_results(0) == [0, 1, 4]
    last = backend.finish(record["id"], 1, "next", "succeeded", "5", TTL)
    assert last.complete and last.state == "succeeded"


def test_only_the_member_that_completed_the_step_may_send_it_again(store):
    backend = workflow_backend(store)
    record, members = chord(store)
    answers = [backend.finish(record["id"], 0, m, "succeeded", "0", TTL) for m in members]
    assert [(a.send_next, a.completer) for a in answers] == [(False, False), (False, False), (True, True)]
    other = backend.finish(record["id"], 0, "m0", "succeeded", "0", TTL)  # redelivered
    again = backend.finish(record["id"], 0, "m2", "succeeded", "0", TTL)  # the completer's delivery again
    assert (other.complete, other.completer, other.send_next) == (True, False, False)
    assert (again.completer, again.send_next) == (True, True)
    backend.mark_sent(record["id"], 0, TTL)
    assert not backend.finish(record["id"], 0, "m2", "succeeded", "0", TTL).send_next


def test_marking_a_step_sent_of_an_expired_workflow_records_nothing(store):
    # Redis: HSET made the expired workflow's hash anew, and PEXPIRE GT gave it no TTL: for ever.
    backend = workflow_backend(store)
    record, _ = chord(store)
    key = backend._key(record["id"]) if isinstance(backend, RedisWorkflows) else None
    if key is not None:
        store.client.delete(key)  # as its TTL would
    workflow_id = record["id"] if key is not None else "expired-or-unknown"
    backend.mark_sent(workflow_id, 0, TTL)
    assert backend.get(workflow_id) is None
    if key is not None:
        assert store.client.exists(key) == 0


def test_a_step_completed_before_the_completer_was_recorded_may_be_sent_by_any_member(store):
    # A workflow in flight across the upgrade: its step completed without ``by:<step>``.
    backend = workflow_backend(store)
    record, members = chord(store)
    for m in members:
        backend.finish(record["id"], 0, m, "succeeded", "0", TTL)
    if isinstance(store, RedisStore):
        store.client.hdel(store.key(f"wf:{record['id']}"), "by:0")
    else:
        with store.transaction() as conn:
            conn.execute("DELETE FROM workflow_fields WHERE field = 'by:0'")
    assert backend.finish(record["id"], 0, "m0", "succeeded", "0", TTL).send_next


def test_a_member_that_did_not_succeed_fails_the_chord_and_is_named(store):
    backend = workflow_backend(store)
    record, _ = chord(store)
    backend.finish(record["id"], 0, "m0", "succeeded", "0", TTL)
    failed = backend.finish(record["id"], 0, "m1", "dead", "null", TTL)
    done = backend.finish(record["id"], 0, "m2", "succeeded", "4", TTL)
    assert failed.state == "failed" and done.complete and done.state == "failed"
    found = backend.get(record["id"])
    assert found is not None and found.failed == "m1" and found.states["m1"] == "dead"


def test_a_finish_step_counts_what_ended_how(store):
    backend = workflow_backend(store)
    record, _ = chord(store, 3, "finished")
    backend.finish(record["id"], 0, "m0", "succeeded", "0", TTL)
    backend.finish(record["id"], 0, "m1", "dead", "null", TTL)
    done = backend.finish(record["id"], 0, "m2", "succeeded", "4", TTL)
    assert done.complete and done.state == "running"
    assert done.counts == {"succeeded": 2, "dead": 1, "cancelled": 0}


def test_an_unknown_workflow_is_answered_not_created(store):
    backend = workflow_backend(store)
    progress = backend.finish("nope", 0, "m0", "succeeded", "0", TTL)
    assert progress.state == "unknown" and not progress.complete
    assert backend.get("nope") is None


def test_cancellation_marks_are_read_in_one_call_and_expire(store):
    backend = cancel_marks(store)
    backend.mark_cancelled(["a", "b"], TTL)
    backend.mark_cancelled(["short"], 1_000)  # long enough to be read back on a loaded machine
    assert backend.cancelled_among(["a", "x", "b", "short"]) == {"a", "b", "short"}
    wait_for(lambda: "short" not in backend.cancelled_among(["short"]), timeout=10, what="the mark to expire")
    assert backend.cancelled_among(["a", "short"]) == {"a"}
    assert backend.cancelled_among([]) == set()


def test_a_poller_reads_the_marks_made_since_a_time(store):
    backend = cancel_marks(store)
    backend.mark_cancelled(["a"], TTL)
    marks, now = backend.cancelled_since(0)
    assert set(marks) == {"a"} and marks["a"] <= now
    backend.mark_cancelled(["b"], TTL)
    later, _ = backend.cancelled_since(now + 1)
    assert set(later) <= {"b"}  # "a" is older (b may share a's millisecond on a fast store)
    assert set(backend.cancelled_since(now - 1_000)[0]) == {"a", "b"}


def test_a_mark_made_after_a_wait_for_the_sqlite_write_lock_is_dated_after_it(tmp_path):
    """A mark dated before its wait for the lock (up to the busy timeout, longer than the pollers'
    overlap) could fall behind a poll made meanwhile, and never be seen."""
    import sqlite3

    from jobsystem.store.sqlite import SqliteStore

    store = SqliteStore(tmp_path / "state.db")
    backend = cancel_marks(store)
    blocker = sqlite3.connect(tmp_path / "state.db", isolation_level=None, check_same_thread=False)
    blocker.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    released = threading.Timer(0.5, blocker.execute, ("COMMIT",))
    released.start()
    asked = store.now_ms()
    backend.mark_cancelled(["late"], TTL)
    released.join()
    marks, _ = backend.cancelled_since(asked + 400)
    assert "late" in marks  # dated once the lock was taken, ~0.5 s after it was asked for
    store.close()


def test_a_workflow_moves_to_cancelled_only_while_it_runs(store):
    backend = workflow_backend(store)
    record, _ = chord(store)
    assert backend.set_state(record["id"], "cancelled")
    assert not backend.set_state(record["id"], "cancelled")
    progress = backend.finish(record["id"], 0, "m0", "succeeded", "0", TTL)
    assert progress.state == "cancelled"


def test_forgetting_a_key_keeps_a_completed_one(store):
    keys = idempotency_backend(store)
    keys.register_many([("pending", "m1", TTL), ("done", "m2", TTL)])
    keys.complete_many([("done", '"ok"', TTL)])
    keys.forget_many(["pending", "done"])
    assert keys.lookup("pending") is None
    record = keys.lookup("done")
    assert record is not None and record.state == "done"


def test_results_are_kept_and_errors_stored_scrubbed(store):
    broker = RecordingBroker()
    actor = dramatiq.actor(broker=broker, actor_name="job", queue_name="q")(lambda: None)
    backend = StoreResultBackend(store, scrub=lambda text: text.replace("ana@example.com", "[email]"))
    ok, failed = actor.message(), actor.message()
    backend.store_result(ok, {"n": 1}, TTL)
    backend.store_exception(failed, ValueError("no mail for ana@example.com"), TTL)
    assert backend.get_result(ok) == {"n": 1}
    with pytest.raises(ResultFailure, match=r"ValueError: no mail for \[email\]"):
        backend.get_result(failed)
    assert not backend.has_result(actor.message())
