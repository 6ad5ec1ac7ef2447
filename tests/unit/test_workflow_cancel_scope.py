"""A workflow's cancel stops that workflow's members only. One message (one message id) may be a
member of two workflows; ``cancel(workflow_id)`` marks each unfinished member with the pair
(message id, workflow id), and every reader honours the pair: the store's marks, the arrival
check, the poller that interrupts running jobs, and the count of a member's end. A direct
``cancel(message_id)`` still stops the id wherever it runs. Marks of the previous release (by id)
still stop arrivals, and the previous release reads a pair's mark as a mark by id. On both stores."""

from __future__ import annotations

import threading
import time
from typing import Any

import dramatiq
import pytest
from dramatiq.middleware import SkipMessage

from jobsystem.runtime.cancellation import CANCELLED, JobCancelled
from jobsystem.store import StateStore
from jobsystem.store.cancel_marks import cancel_marks
from jobsystem.store.redis import RedisStore, reply_text
from jobsystem.store.sqlite import SqliteStore
from jobsystem.workflows import cancel, group, workflow_status
from middleware.cancellation import Cancellation
from middleware.workflows import Workflows
from tests.unit.stub import RecordingBroker, delivery

TTL = 60_000


def shared_in_two_groups(store: StateStore) -> tuple[Any, ...]:
    """One message in two groups, both run on a stub broker. Returns the broker, the middleware,
    the two copies as sent (each with its own workflow option) and the two workflow ids. The
    poller polls when a test says (no thread of its own)."""
    cancellation = Cancellation(store, keep_ms=TTL, poll_interval=60)
    cancellation.watch.start = lambda: None  # type: ignore[method-assign]
    workflows = Workflows(store, ttl_ms=TTL, cancel_ttl_ms=TTL)
    broker = RecordingBroker(middleware=[cancellation, workflows])
    square = dramatiq.actor(broker=broker, actor_name="square", queue_name="q")(lambda i: i * i)
    shared = square.message(1)
    stopped, running = group([shared], broker=broker).run(), group([shared], broker=broker).run()
    (in_stopped, _), (in_running, _) = broker.enqueued
    assert in_stopped.message_id == in_running.message_id
    ids = (str(stopped.workflow_id), str(running.workflow_id))
    return broker, cancellation, workflows, in_stopped, in_running, ids


def test_a_pair_mark_stops_its_workflows_copy_only_and_a_mark_by_id_every_copy(store: StateStore) -> None:
    marks = cancel_marks(store)
    marks.mark_cancelled([("m", "w1")], TTL)
    asked: list[Any] = ["m", ("m", "w1"), ("m", "w2")]
    assert marks.cancelled_among(asked) == {("m", "w1")}
    assert set(marks.cancelled_since(0)[0]) == {("m", "w1")}
    marks.mark_cancelled([("m", "w2")], TTL)  # the other workflow is cancelled too
    assert marks.cancelled_among(asked) == {("m", "w1"), ("m", "w2")}
    marks.mark_cancelled(["m"], TTL)  # cancel(message_id): wherever it runs
    assert marks.cancelled_among([*asked, ("m", "w3")]) == {*asked, ("m", "w3")}
    assert "m" in marks.cancelled_since(0)[0]
    marks.mark_cancelled([("m", "w4")], TTL)  # a workflow's cancel keeps the mark by id
    assert marks.cancelled_among(["m", ("m", "w5")]) == {"m", ("m", "w5")}
    assert "m" in marks.cancelled_since(0)[0]
    marks.mark_cancelled([("short", "w1")], 50)
    assert marks.cancelled_among([("short", "w1")]) == {("short", "w1")}
    deadline = time.monotonic() + 5
    while marks.cancelled_among([("short", "w1")]):
        assert time.monotonic() < deadline, "the pair's mark never expired"
        time.sleep(0.01)
    assert ("short", "w1") not in marks.cancelled_since(0)[0]


def test_cancelling_a_workflow_stops_its_copy_on_arrival_and_a_direct_cancel_every_copy(
    store: StateStore,
) -> None:
    broker, cancellation, _, in_stopped, in_running, (stopped, running) = shared_in_two_groups(store)
    message_id = in_stopped.message_id
    assert cancel(stopped, broker=broker) == [message_id]
    # The store's answer: the copy in the cancelled workflow, not the other one, nor the message
    # sent on its own (no workflow).
    asked = [(message_id, stopped), (message_id, running), (message_id, None)]
    assert cancellation._check_many(asked) == [True, False, False]
    cancellation.watch.poll_once()
    assert cancellation.watch.known(message_id, stopped) is True
    assert cancellation.watch.known(message_id, running) is False
    assert cancellation.watch.known(message_id) is False
    arrived = delivery(in_stopped)
    with pytest.raises(SkipMessage, match="cancelled"):
        cancellation.before_process_message(broker, arrived)
    assert arrived.options[CANCELLED] is True
    runs = delivery(in_running)
    cancellation.before_process_message(broker, runs)  # not skipped
    assert CANCELLED not in runs.options
    cancellation.after_process_message(broker, runs, result=1)
    assert cancel(message_id, broker=broker) == [message_id]  # by message id: every copy
    assert cancellation._check_many(asked) == [True, True, True]
    cancellation.watch.poll_once()
    assert cancellation.watch.known(message_id, running) is True
    with pytest.raises(SkipMessage, match="cancelled"):
        cancellation.before_process_message(broker, delivery(in_running))


def test_the_poller_interrupts_the_copy_running_in_the_cancelled_workflow_only(store: StateStore) -> None:
    """Both copies run at once, in two threads: only the cancelled workflow's is interrupted (the
    running jobs were kept by message id: the second copy's registration replaced the first's)."""
    broker, cancellation, _, in_stopped, in_running, (stopped, _) = shared_in_two_groups(store)
    cancellation.watch.poll_once()  # up to date: the arrivals are answered without the store
    outcomes: dict[str, str] = {}
    release = threading.Event()

    def run(copy: Any, name: str, ready: threading.Event) -> None:
        arrived = delivery(copy)
        cancellation.before_process_message(broker, arrived)
        ready.set()
        try:
            while not release.is_set():  # short sleeps: the interrupt lands between two of them
                time.sleep(0.01)
            outcomes[name] = "returned"
        except JobCancelled:
            outcomes[name] = "interrupted"
        finally:
            cancellation.after_process_message(broker, arrived, result=None)

    threads = []
    for copy, name in ((in_stopped, "stopped"), (in_running, "running")):  # the running one last
        ready = threading.Event()
        threads.append(threading.Thread(target=run, args=(copy, name, ready)))
        threads[-1].start()
        assert ready.wait(5)
    cancel(stopped, broker=broker)
    assert cancellation.watch.poll_once() == [in_stopped.message_id]
    deadline = time.monotonic() + 5
    while "stopped" not in outcomes:
        assert time.monotonic() < deadline, "the cancelled workflow's copy was never interrupted"
        time.sleep(0.01)
    release.set()
    for thread in threads:
        thread.join(5)
    assert outcomes == {"stopped": "interrupted", "running": "returned"}
    assert cancellation.watch.poll_once() == []


def test_a_copy_that_returns_counts_as_cancelled_in_the_cancelled_workflow_only(store: StateStore) -> None:
    """A member that returns after the cancel counts as cancelled by its mark; the same message
    returning in the workflow nobody cancelled counts as succeeded, and that workflow succeeds."""
    broker, _, workflows, in_stopped, in_running, (stopped, running) = shared_in_two_groups(store)
    cancel(stopped, broker=broker)
    workflows.after_process_message(broker, delivery(in_running), result=1)
    workflows.after_process_message(broker, delivery(in_stopped), result=1)  # before any interrupt
    shown = {w: workflow_status(w, broker=broker) for w in (stopped, running)}
    assert {w: (s or {}).get("state") for w, s in shown.items()} == {
        stopped: "cancelled",
        running: "succeeded",
    }
    assert [m["state"] for m in (shown[running] or {})["steps"][0]["members"]] == ["succeeded"]
    assert [m["state"] for m in (shown[stopped] or {})["steps"][0]["members"]] == ["cancelled"]


def write_as_the_previous_release(store: StateStore, message_id: str, ttl_ms: int) -> None:
    """A mark by id as the previous release's ``mark_cancelled`` wrote it."""
    if isinstance(store, RedisStore):
        seconds, micros = store.client.time()
        store.client.set(store.key(f"cancel:{message_id}"), "1", px=ttl_ms)
        store.client.zadd(store.key("cancels"), {message_id: seconds * 1000 + micros // 1000})
        return
    assert isinstance(store, SqliteStore)
    with store.transaction() as conn:
        at = store.now_ms()
        conn.execute(
            "INSERT OR REPLACE INTO cancel_marks (id, marked_at, expires_at) VALUES (?, ?, ?)",
            (store.key(message_id), at, at + ttl_ms),
        )


def read_as_the_previous_release(store: StateStore, message_id: str) -> tuple[bool, bool]:
    """Whether a worker of the previous release sees ``message_id`` marked: its arrival check
    (``cancelled_among``) and its poller (``cancelled_since``), as that release read them."""
    if isinstance(store, RedisStore):
        exact = store.client.exists(store.key(f"cancel:{message_id}")) == 1
        polled = store.client.zrangebyscore(store.key("cancels"), 0, "+inf")
        return exact, message_id in [reply_text(m) for m in polled]
    assert isinstance(store, SqliteStore)
    now, key = store.now_ms(), store.key(message_id)
    found = store.rows("SELECT id FROM cancel_marks WHERE id IN (?) AND expires_at > ?", (key, now))
    since = store.rows("SELECT id FROM cancel_marks WHERE marked_at >= ? AND expires_at > ?", (0, now))
    return bool(found), key in [row[0] for row in since]


def test_marks_of_either_release_are_read_by_the_other_failing_closed(store: StateStore) -> None:
    """During a rollout: the previous release reads a pair's mark as a mark by id (it stops the
    message in every workflow, as it did before: never runs a cancelled member), and a mark by id
    it writes stops the id everywhere here, also over a pair's mark."""
    marks = cancel_marks(store)
    marks.mark_cancelled([("m", "w1")], TTL)
    assert read_as_the_previous_release(store, "m") == (True, True)
    write_as_the_previous_release(store, "old", TTL)
    assert marks.cancelled_among(["old", ("old", "w1")]) == {"old", ("old", "w1")}
    assert "old" in marks.cancelled_since(0)[0]
    write_as_the_previous_release(store, "m", TTL)  # its direct cancel, over the pair's mark
    assert marks.cancelled_among(["m", ("m", "w2")]) == {"m", ("m", "w2")}
    polled, _ = marks.cancelled_since(0)
    assert "m" in polled and ("m", "w1") in polled
