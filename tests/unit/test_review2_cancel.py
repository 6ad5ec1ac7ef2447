"""Review of fix/review1's ``cancelled_among`` pairs: one message id may be a member of two
workflows, and each (member, workflow) pair is now answered for its own workflow, but only once
the cancel's marks have expired. ``cancel(workflow_id)`` marks its unfinished members by message
id (``jobsystem.workflows.cancel``), and a mark stops every arrival of that id, in any workflow:
for as long as the mark lives (``CANCEL_TTL_MS``, the window in which the members arrive), the
copy in the workflow nobody cancelled was skipped as cancelled (and a running one interrupted).
Fixed: a workflow's cancel marks the pair (message id, workflow id); more cases, the running
copy's interrupt and the previous release's marks, in ``test_workflow_cancel_scope.py``."""

from __future__ import annotations

import dramatiq
import pytest
from dramatiq.middleware import SkipMessage

from jobsystem.runtime.cancellation import CANCELLED
from jobsystem.store import StateStore
from jobsystem.workflows import cancel, group
from middleware.cancellation import Cancellation
from middleware.workflows import Workflows
from tests.unit.stub import RecordingBroker, delivery

#: Marks and records that outlive the test: the arrival comes while the mark lives.
LONG_MS = 60_000


def test_cancelling_one_workflow_leaves_the_same_message_in_another_running(store: StateStore) -> None:
    cancellation = Cancellation(store, keep_ms=LONG_MS, poll_interval=60)
    cancellation.watch.start = lambda: None  # type: ignore[method-assign]
    workflows = Workflows(store, ttl_ms=LONG_MS, cancel_ttl_ms=LONG_MS)
    broker = RecordingBroker(middleware=[cancellation, workflows])
    square = dramatiq.actor(broker=broker, actor_name="square", queue_name="q")(lambda i: i * i)
    shared = square.message(1)  # the same message (one message id) in two workflows
    stopped = group([shared], broker=broker).run()
    running = group([shared], broker=broker).run()
    (_, _), (in_running, _) = broker.enqueued
    assert cancel(str(stopped.workflow_id), broker=broker) == [shared.message_id]
    try:
        # Asked of the store for the copy in the workflow nobody cancelled: not cancelled.
        assert cancellation._check_many([(shared.message_id, str(running.workflow_id))]) == [False]
        cancellation.watch.poll_once()  # the worker's poller has read the marks
        arrived = delivery(in_running)
        try:
            cancellation.before_process_message(broker, arrived)
        except SkipMessage:
            pytest.fail("the copy in the running workflow was skipped as cancelled")
        assert not arrived.options.get(CANCELLED)
    finally:
        cancellation.watch.stop()
