"""A workflow member cancelled while it runs, whose actor returns before any poll interrupts it:
the cancel mark is in the store when the member's end is counted, so the member counts as
cancelled and the next step is not sent. A workflow cancelled once a step was counted complete
and before its worker sent the next step: the next step is sent, and skipped on arrival. In
process, with Dramatiq's worker, on both stores. A workflow cancelled just as a member returns
(counted cancelled, by its mark, before the cancel records the workflow's state) ends cancelled."""

from __future__ import annotations

import threading
import time
from typing import Any

import dramatiq
from dramatiq import Message

from jobsystem.store import StateStore
from jobsystem.workflows import cancel, pipeline, workflow_status
from middleware.cancellation import Cancellation, ForgetCancelledKeys
from middleware.workflows import Workflows
from tests.unit.stub import RecordingBroker

TTL = 60_000


def wait_until(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_member_cancelled_while_it_runs_sends_no_next_step(store: StateStore) -> None:
    # Polls once, at start: the mark made below is never raised into the job.
    cancellation = Cancellation(store, keep_ms=TTL, poll_interval=60)
    workflows = Workflows(store, ttl_ms=TTL, cancel_ttl_ms=TTL)
    broker = RecordingBroker(middleware=[cancellation, workflows, ForgetCancelledKeys()])
    started, release = threading.Event(), threading.Event()
    ran: list[Any] = []

    def hold() -> int:
        started.set()
        assert release.wait(10)  # the barrier: opened once the test has cancelled this job
        return 1

    held = dramatiq.actor(broker=broker, actor_name="held", queue_name="q")(hold)
    after = dramatiq.actor(broker=broker, actor_name="after", queue_name="q")(ran.append)
    first = held.message()
    flow = pipeline([first, after.message_with_options()], broker=broker).run()
    worker = dramatiq.Worker(broker, worker_threads=1, worker_timeout=50)
    worker.start()
    try:
        wait_until(lambda: cancellation.watch.known("x") is not None)  # its one poll is done
        assert started.wait(5)
        assert cancel(first.message_id, broker=broker) == [first.message_id]
        release.set()
        broker.join("q")
        worker.join()
    finally:
        worker.stop()
        cancellation.watch.stop()
    assert ran == [] and [m.actor_name for m, _ in broker.enqueued] == ["held"]
    status = workflow_status(str(flow.workflow_id), broker=broker)
    assert status is not None and status["state"] == "failed"
    assert status["failed_member"]["id"] == first.message_id
    assert status["failed_member"]["state"] == "cancelled"


def test_a_cancel_between_the_count_and_the_send_of_the_next_step_stops_it(store: StateStore) -> None:
    """The cancel lands after the first step was counted complete (the workflow still ran, so the
    step is to be sent) and before its worker sends the next one: the next step is marked in the
    store, but arrives sooner than a poll brings the mark to the worker, and it ran."""
    cancellation = Cancellation(store, keep_ms=TTL, poll_interval=60)
    cancellation.watch.stale_after = 3_600  # its one poll, made below, stays current throughout
    workflows = Workflows(store, ttl_ms=TTL, cancel_ttl_ms=TTL)
    broker = RecordingBroker(middleware=[cancellation, workflows, ForgetCancelledKeys()])
    ran: list[Any] = []
    first = dramatiq.actor(broker=broker, actor_name="first", queue_name="q")(lambda: 1).message()
    after = dramatiq.actor(broker=broker, actor_name="after", queue_name="q")(ran.append)
    flow = pipeline([first, after.message_with_options()], broker=broker)
    count = workflows.backend.finish

    def count_then_cancel(workflow_id: str, step: int, member: str, *rest: Any, **named: Any) -> Any:
        progress = count(workflow_id, step, member, *rest, **named)
        if member == first.message_id:
            assert progress.send_next  # the count said "send", the cancel comes now
            assert cancel(workflow_id, broker=broker) != []
        return progress

    workflows.backend.finish = count_then_cancel  # type: ignore[method-assign]
    cancellation.watch.start()
    wait_until(lambda: cancellation.watch.known("x") is not None)  # its one poll is done: no mark
    flow.run()
    worker = dramatiq.Worker(broker, worker_threads=1, worker_timeout=50)
    worker.start()
    try:
        broker.join("q")
        worker.join()
    finally:
        worker.stop()
        cancellation.watch.stop()
    assert [m.actor_name for m, _ in broker.enqueued] == ["first", "after"]  # sent, then skipped
    assert ran == []
    status = workflow_status(str(flow.workflow_id), broker=broker)
    assert status is not None and status["state"] == "cancelled"
    assert [m["state"] for m in status["steps"][1]["members"]] == ["cancelled"]


def test_a_cancel_whose_marks_fail_leaves_the_workflow_running_not_cancelled(store: StateStore) -> None:
    """The marks stop the members: a cancel that could not write them must not show the workflow
    cancelled (its members would run on under a cancelled workflow); it raises, and a second call
    finishes the cancel."""
    from jobsystem.store.base import StoreUnavailable

    workflows, broker, (first, after), workflow_id = _two_steps_sent(store)
    mark = workflows.marks.mark_cancelled

    def refused(*args: Any, **kwargs: Any) -> None:
        raise StoreUnavailable("OOM command not allowed when used memory > 'maxmemory'")

    workflows.marks.mark_cancelled = refused  # type: ignore[method-assign]
    try:
        cancel(workflow_id, broker=broker)
    except StoreUnavailable:
        pass
    else:
        raise AssertionError("the cancel did not raise")
    status = workflow_status(workflow_id, broker=broker)
    assert status is not None and status["state"] != "cancelled"
    workflows.marks.mark_cancelled = mark  # type: ignore[method-assign]
    assert sorted(cancel(workflow_id, broker=broker)) == sorted([first.message_id, after.message_id])
    status = workflow_status(workflow_id, broker=broker)
    assert status is not None and status["state"] == "cancelled"


def _two_steps_sent(store: StateStore) -> tuple[Workflows, RecordingBroker, list[Message[Any]], str]:
    """A pipeline of two steps (``first``, then ``after``) run on a stub broker: its first step
    sent, not processed. Returns the middleware, the broker, the two steps as sent and its id."""
    workflows = Workflows(store, ttl_ms=TTL, cancel_ttl_ms=TTL)
    broker = RecordingBroker(middleware=[workflows])
    first = dramatiq.actor(broker=broker, actor_name="first", queue_name="q")(lambda: 1).message()
    after = dramatiq.actor(broker=broker, actor_name="after", queue_name="q")(
        lambda _: None
    ).message_with_options()
    flow = pipeline([first, after], broker=broker)
    flow.run()
    (sent, _), *_ = broker.enqueued  # the first step as sent: its workflow option on it
    assert sent.message_id == first.message_id
    return workflows, broker, [sent, after], str(flow.workflow_id)


def test_a_workflow_cancelled_while_a_member_returns_is_shown_cancelled(store: StateStore) -> None:
    """The first member returns just as the operator cancels the workflow: its worker counts it
    (as ``succeeded``, taken for ``cancelled`` since its mark is there) after the marks were written
    and before the workflow's state was. The operator cancelled the workflow: it must say so."""
    workflows, broker, (first, after), workflow_id = _two_steps_sent(store)
    mark = workflows.marks.mark_cancelled

    def mark_then_first_returns(*args: Any, **kwargs: Any) -> None:
        mark(*args, **kwargs)
        workflows.member_finished(broker, first, "succeeded", 1)  # the member's worker, meanwhile

    workflows.marks.mark_cancelled = mark_then_first_returns  # type: ignore[method-assign]
    assert sorted(cancel(workflow_id, broker=broker)) == sorted([first.message_id, after.message_id])
    status = workflow_status(workflow_id, broker=broker)
    assert status is not None
    assert [m["state"] for m in status["steps"][0]["members"]] == ["cancelled"]
    assert status["state"] == "cancelled", status["failed_member"]
    # Nor does a second cancel, which the docstring offers to finish an interrupted one, fix it.
    workflows.marks.mark_cancelled = mark  # type: ignore[method-assign]
    cancel(workflow_id, broker=broker)
    status = workflow_status(workflow_id, broker=broker)
    assert status is not None and status["state"] == "cancelled"
