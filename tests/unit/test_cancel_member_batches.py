"""Review of fix/wfcancel: a store check of a batch of arrivals answers each arrival for its own
workflow. One message id may be a member of two workflows (``annotate`` refuses a message given
twice in one workflow only): the two copies differ by their workflow option alone, and the
coalescer hands arrivals of several worker threads to one ``_check_many`` call."""

from __future__ import annotations

from jobsystem.store import StateStore
from jobsystem.store.cancel_marks import cancel_marks
from jobsystem.workflows import cancel, group
from tests.unit.stub import noting_calls
from tests.unit.workflow_brokers import short_marks_broker, wait_until


def test_two_copies_of_one_message_in_one_batch_are_each_answered_for_their_own_workflow(
    store: StateStore,
) -> None:
    broker, cancellation, _, square, _ = short_marks_broker(store)
    shared = square.message(1)  # the same message (one message id) in two workflows
    stopped = group([shared], broker=broker).run()
    running = group([shared], broker=broker).run()
    (in_stopped, _), (in_running, _) = broker.enqueued
    assert in_stopped.message_id == in_running.message_id
    assert cancel(str(stopped.workflow_id), broker=broker) == [shared.message_id]
    marks = cancel_marks(store)
    stopped_arrival = (shared.message_id, str(stopped.workflow_id))
    wait_until(lambda: not marks.cancelled_among([stopped_arrival]))  # now its workflow's record alone
    running_arrival = (shared.message_id, str(running.workflow_id))
    # Asked one at a time, each arrival gets its own workflow's answer.
    assert cancellation._check_many([stopped_arrival]) == [True]
    assert cancellation._check_many([running_arrival]) == [False]
    # Arriving together (one coalesced batch), they get the same answers: keyed by message id, the
    # copy in the cancelled workflow ran ([False, False]) or, in the other order, the running one
    # was skipped.
    assert cancellation._check_many([stopped_arrival, running_arrival]) == [True, False]
    assert cancellation._check_many([running_arrival, stopped_arrival]) == [False, True]
    cancellation.watch.stop()


def test_a_batch_asks_the_store_once_and_a_batch_with_no_member_asks_the_marks_only(
    store: StateStore,
) -> None:
    """Answering each pair costs no second round trip: a batch with a workflow's member makes one
    call (the workflows' check, which reads the marks too), a batch with none the marks' call."""
    _, cancellation, _, _, _ = short_marks_broker(store)
    calls: list[str] = []
    noting_calls(cancellation.backend, "cancelled_among", calls, "marks")
    noting_calls(cancellation.workflows, "cancelled_among", calls, "workflows")
    assert cancellation._check_many([("a", None), ("b", "w1"), ("b", "w2"), ("a", None)]) == [False] * 4
    assert calls == ["workflows"]
    assert cancellation._check_many([("a", None), ("c", None)]) == [False, False]
    assert calls == ["workflows", "marks"]
    cancellation.watch.stop()
