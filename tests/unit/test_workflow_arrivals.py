"""Cancellation on arrival and while running: a cancelled message or workflow member is skipped
(asking the store until the poller is up, and after its mark expired), a store that errs defers
it, a running job is interrupted and one that ended is not."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import dramatiq
import pytest
from dramatiq.middleware import SkipMessage

from jobsystem.runtime.cancellation import CANCELLED, CancelWatch, JobCancelled
from jobsystem.runtime.workflow_steps import Step, annotate
from jobsystem.store import StoreUnavailable
from jobsystem.store.cancel_marks import Mark, cancel_marks
from jobsystem.store.workflows import workflow_backend
from middleware.cancellation import Cancellation
from tests.unit.stub import RecordingBroker, delivery, noting_calls
from tests.unit.workflow_brokers import (
    SHORT,
    TTL,
    arrives_cancelled,
    cancellation_broker,
    chord,
    short_marks_broker,
    wait_until,
)


def test_a_cancelled_message_is_skipped_on_arrival_asking_the_store_until_the_poller_is_up(store):
    broker, cancellation, job = cancellation_broker(store)
    message = job.message()
    cancellation.backend.mark_cancelled([message.message_id], TTL)
    asked: list[Mark] = []
    exact = cancellation.backend.cancelled_among

    def asking(marks: Sequence[Mark]) -> set[Mark]:
        asked.extend(marks)
        return exact(marks)

    cancellation.backend.cancelled_among = asking  # type: ignore[method-assign]
    arrived = delivery(message)
    with pytest.raises(SkipMessage, match="cancelled"):
        cancellation.before_process_message(broker, arrived)
    assert arrived.options[CANCELLED] is True and broker.enqueued == []
    wait_until(lambda: cancellation.watch.known("x") is not None)
    asked.clear()
    with pytest.raises(SkipMessage, match="cancelled"):  # the poller knows: no store call
        cancellation.before_process_message(broker, delivery(message))
    cancellation.before_process_message(broker, delivery(job.message()))  # not marked: runs
    assert asked == []
    cancellation.watch.stop()


def test_a_message_older_than_the_pollers_memory_is_checked_against_the_store(store):
    broker, cancellation, job = cancellation_broker(store)
    wait_until(lambda: cancellation.watch.known("x") is not None)
    # Sent a month ago, cancelled then with a mark that lives until it is due: the poller has
    # forgotten the mark (it keeps marks for TTL), the store has not.
    month_old = job.message().copy(message_timestamp=int(time.time() * 1000) - 30 * 86_400_000)
    cancellation.backend.mark_cancelled([month_old.message_id], 31 * 86_400_000)
    cancellation.watch._marks.pop(month_old.message_id, None)
    assert cancellation.watch.known(month_old.message_id) is False
    with pytest.raises(SkipMessage, match="cancelled"):
        cancellation.before_process_message(broker, delivery(month_old))
    cancellation.watch.stop()


def test_a_store_that_errs_on_arrival_defers_the_message(store, caplog):
    broker, cancellation, job = cancellation_broker(store)

    def down(*args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable("redis: ResponseError: OOM command not allowed")

    # The poller cannot read the marks, so the arrival asks the store, which errs: deferred, as a
    # store that is down (a warning), not as a guard that failed unexpectedly (an error).
    cancellation.backend.cancelled_among = down  # type: ignore[method-assign]
    cancellation.watch.cancelled_since = down
    with pytest.raises(SkipMessage, match="deferred: store_unavailable"):
        cancellation.before_process_message(broker, delivery(job.message()))
    (copy, delay), *_ = broker.enqueued
    assert delay is not None and delay > 0 and copy.options["cancellation_store_waits"] == 1
    assert "cancellation_store_unavailable" in [r.msg for r in caplog.records if r.levelname == "WARNING"]
    assert "guard_failed" not in caplog.text
    cancellation.watch.stop()


def test_a_running_job_is_interrupted_and_one_that_ended_is_not(store):
    backend = cancel_marks(store)
    running = CancelWatch(backend.cancelled_since, keep_ms=TTL, interval=0.05)
    running.start()
    outcome: dict[str, Any] = {}
    started = threading.Event()

    def job() -> None:
        running.started("long")
        started.set()
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                time.sleep(0.01)
            outcome["ran_out"] = True
        except JobCancelled:
            outcome["cancelled_at"] = time.monotonic()
        finally:
            running.ended("long")

    worker = threading.Thread(target=job)
    worker.start()
    started.wait(5)
    running.started("other")
    running.ended("other")  # ended before its mark: never interrupted
    marked_at = time.monotonic()
    backend.mark_cancelled(["long", "other"], TTL)
    worker.join(10)
    running.stop()
    assert "ran_out" not in outcome and outcome["cancelled_at"] - marked_at < 1.0
    assert running.poll_once() == []


def test_a_cancel_after_the_actor_returned_is_not_raised_into_the_after_hooks(store):
    """ForgetCancelledKeys' after hook runs first: from then on a cancel cannot interrupt the
    others (a workflow's next step half sent), though Cancellation's own hook runs last."""
    from middleware.cancellation import ForgetCancelledKeys

    cancellation, first_after = Cancellation(store, keep_ms=TTL, poll_interval=60), ForgetCancelledKeys()
    broker = RecordingBroker(middleware=[cancellation, first_after])
    job = dramatiq.actor(broker=broker, actor_name="job", queue_name="q")(lambda: None)
    message = delivery(job.message())
    cancellation.before_process_message(broker, message)  # running, on this thread
    first_after.after_process_message(broker, message, result=None)
    cancellation.backend.mark_cancelled([message.message_id], TTL)
    assert cancellation.watch.poll_once() == []
    cancellation.after_process_message(broker, message, result=None)
    cancellation.watch.stop()


def test_an_arrival_is_registered_as_running_only_when_known_unmarked_and_asked(store):
    backend = cancel_marks(store)
    watch = CancelWatch(backend.cancelled_since, keep_ms=TTL, interval=60)
    backend.mark_cancelled(["marked"], TTL)
    wait_until(lambda: watch.known("x") is not None)  # the poller's first poll is in
    outcome: dict[str, Any] = {}
    arrived = threading.Event()

    def job() -> None:
        outcome["answer"] = watch.arrived("runs", start=True)
        arrived.set()
        try:  # short sleeps: the interrupt lands between two of them, not after 10 s
            for _ in range(1000):
                time.sleep(0.01)
        except JobCancelled:
            outcome["interrupted"] = True

    worker = threading.Thread(target=job)
    worker.start()
    arrived.wait(5)
    assert watch.arrived("confirmed", start=False) is False  # known, not registered
    assert watch.arrived("marked", start=True) is True  # cancelled: not registered
    backend.mark_cancelled(["runs", "confirmed"], TTL)
    assert watch.poll_once() == ["runs"]
    worker.join(10)
    watch.stop()
    assert outcome == {"answer": False, "interrupted": True}


def test_the_members_a_cancelled_workflow_stops_are_read_with_the_marks_while_it_is_recorded(store):
    """A member is stopped by its mark, or by its workflow recorded cancelled unless the workflow
    counted it as ended otherwise before; an expired workflow stops nothing (on SQLite its rows
    stay until a sweep)."""
    backend = workflow_backend(store)
    record, _ = chord(store)
    cancel_marks(store).mark_cancelled(["marked"], TTL)
    members = [(m, record["id"]) for m in ("m0", "m1", "m2", "next")]
    backend.finish(record["id"], 0, "m0", "succeeded", "0", TTL)  # ended before the cancel
    asked = [("marked", None), ("plain", None), *members]
    assert backend.cancelled_among(asked) == [True, False, False, False, False, False]  # it runs
    assert backend.set_state(record["id"], "cancelled")
    backend.finish(record["id"], 0, "m1", "cancelled", "null", TTL)  # skipped since
    assert backend.cancelled_among([*asked, ("plain", "unknown")]) == [
        *(True, False),  # marked, plain
        *(False, True, True, True),  # m0 ended before the cancel, m1, m2, next
        False,  # plain, of a workflow that is not recorded
    ]
    short = {**record, "id": "short"}
    backend.create(short, 50)
    assert backend.set_state("short", "cancelled")
    assert backend.cancelled_among([("m0", "short")]) == [True]
    # One message in two workflows, asked in one call: each pair answered for its own workflow.
    assert backend.cancelled_among([("m0", record["id"]), ("m0", "short")]) == [False, True]
    wait_until(lambda: backend.get("short") is None)
    assert backend.cancelled_among([("m0", "short")]) == [False]
    assert backend.cancelled_among([]) == []


def test_a_step_sent_as_its_workflow_is_cancelled_is_skipped_after_its_mark_expired(store):
    """The cancel lands between the count that completes the first step and the send of the next
    one, delayed longer than the marks live: the step arrived with no mark left and ran, in a
    workflow recorded cancelled. Its workflow's record says so as long as it exists."""
    from jobsystem.workflows import cancel, pipeline, workflow_status

    broker, cancellation, workflows, square, total = short_marks_broker(store)
    flow = pipeline([square.message(2), total.message_with_options(delay=10 * SHORT)], broker=broker)
    count = workflows.backend.finish

    def count_then_cancel(workflow_id: str, step: int, *rest: Any, **named: Any) -> Any:
        progress = count(workflow_id, step, *rest, **named)
        if step == 0:
            assert progress.send_next and cancel(workflow_id, broker=broker)
        return progress

    workflows.backend.finish = count_then_cancel  # type: ignore[method-assign]
    flow.run()
    workflows.after_process_message(broker, delivery(broker.enqueued[0][0]), result=4)
    (step, delay) = broker.enqueued[1]
    assert step.actor_name == "total" and delay == 10 * SHORT  # sent after the cancel
    arrived = arrives_cancelled(store, broker, cancellation, step)
    workflows.after_skip_message(broker, arrived)  # counted as cancelled, not failed
    shown = workflow_status(str(flow.workflow_id), broker=broker)
    assert shown is not None and shown["state"] == "cancelled"
    assert [m["state"] for m in shown["steps"][1]["members"]] == ["cancelled"]


def test_a_first_step_member_delayed_past_its_mark_is_skipped_but_not_one_counted_before(store):
    """With ``JOB_STATUS=false`` a mark lives ``CANCEL_TTL_MS`` whatever the member's delay: a
    member due later arrived with none left and ran. A member that ended before the cancel was
    not marked by it: its redelivery is not stopped by the workflow's state either."""
    from jobsystem.workflows import cancel, group

    broker, cancellation, workflows, square, _ = short_marks_broker(store)
    fan_out = group(
        [square.message(1), square.message_with_options(args=(2,), delay=10 * SHORT)], broker=broker
    )
    fan_out.run()
    (done, _), (late, _) = broker.enqueued
    workflows.after_process_message(broker, delivery(done), result=1)
    assert cancel(str(fan_out.workflow_id), broker=broker) == [late.message_id]
    arrives_cancelled(store, broker, cancellation, late)
    again = delivery(done, redelivered=True)
    cancellation.before_process_message(broker, again)  # as old as the pollers' memory: asked, runs
    assert CANCELLED not in again.options


def test_a_members_workflow_is_read_in_the_marks_call_and_a_store_error_defers_it(store):
    """A workflow's member asks the store once, the marks and its workflow in one call; a job that
    is not a member asks for its mark only, as before. A store error defers the member (fail closed)."""
    broker, cancellation, _, square, _ = short_marks_broker(store)
    calls: list[str] = []
    members = cancellation.workflows.cancelled_among
    noting_calls(cancellation.backend, "cancelled_among", calls, "marks")

    def down(arrivals: Any) -> list[bool]:
        calls.append("workflows")
        raise StoreUnavailable("redis: ResponseError: OOM command not allowed")

    cancellation.workflows.cancelled_among = down  # type: ignore[method-assign]
    plain = dramatiq.actor(broker=broker, actor_name="plain", queue_name="q")(lambda: None)
    cancellation.before_process_message(broker, delivery(plain.message()))
    assert calls == ["marks"]
    _, first = annotate("group", [Step([square.message(1)], pipe="list")])
    with pytest.raises(SkipMessage, match="deferred: store_unavailable"):
        cancellation.before_process_message(broker, delivery(first[0]))
    assert calls == ["marks", "workflows"]
    (copy, delay), *_ = broker.enqueued
    assert delay and copy.options["cancellation_store_waits"] == 1
    cancellation.workflows.cancelled_among = members  # type: ignore[method-assign]
