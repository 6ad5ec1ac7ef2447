"""A workflow member cancelled while it runs, whose actor returns before any poll interrupts it:
the cancel mark is in the store when the member's end is counted, so the member counts as
cancelled and the next step is not sent. In process, with Dramatiq's worker, on both stores."""

from __future__ import annotations

import threading
import time
from typing import Any

import dramatiq

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
    started, release, ran = threading.Event(), threading.Event(), []

    def hold() -> int:
        started.set()
        assert release.wait(10)  # the barrier: opened once the test has cancelled this job
        return 1

    held = dramatiq.actor(broker=broker, actor_name="held", queue_name="q")(hold)
    after = dramatiq.actor(broker=broker, actor_name="after", queue_name="q")(ran.append)
    first = held.message()
    flow = pipeline([first, after.message()], broker=broker).run()
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
