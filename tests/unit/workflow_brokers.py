"""Workflows and cancellation on a recording broker, for the unit tests of workflows: chords created
in the store, brokers with the Workflows, Cancellation and Idempotency middleware, and waiting for
a cancel mark to expire."""

from __future__ import annotations

import time
from typing import Any

import dramatiq
import pytest
from dramatiq.middleware import SkipMessage

from jobsystem.runtime.cancellation import CANCELLED
from jobsystem.runtime.workflow_steps import WORKFLOW, Step, annotate
from jobsystem.store import StateStore
from jobsystem.store.cancel_marks import cancel_marks
from jobsystem.store.workflows import workflow_backend
from middleware.cancellation import Cancellation
from middleware.workflows import Workflows
from tests.unit.stub import RecordingBroker, delivery

__all__ = [
    "SHORT",
    "TTL",
    "DedupingBroker",
    "arrives_cancelled",
    "cancellation_broker",
    "chord",
    "keyed_workflow_broker",
    "short_marks_broker",
    "square_chord",
    "wait_until",
    "workflow_broker",
]

TTL = 60_000


def chord(store: StateStore, size: int = 3, mode: str = "success") -> tuple[dict[str, Any], list[str]]:
    record = {
        "id": f"wf{size}{mode}",
        "kind": "chord",
        "steps": [
            {"mode": mode, "members": [{"id": f"m{i}", "actor": "a", "queue": "q"} for i in range(size)]},
            {"mode": "success", "members": [{"id": "next", "actor": "b", "queue": "q"}]},
        ],
    }
    workflow_backend(store).create(record, TTL)
    return record, [f"m{i}" for i in range(size)]


def workflow_broker(store: StateStore) -> tuple[RecordingBroker, Workflows, Any, Any]:
    workflows = Workflows(store, ttl_ms=TTL, cancel_ttl_ms=TTL)
    broker = RecordingBroker(middleware=[workflows])
    square = dramatiq.actor(broker=broker, actor_name="square", queue_name="q")(lambda i: i * i)
    total = dramatiq.actor(broker=broker, actor_name="total", queue_name="q")(lambda results: sum(results))
    return broker, workflows, square, total


def square_chord(
    store: StateStore, members: int = 2
) -> tuple[RecordingBroker, Workflows, dict[str, Any], list[Any]]:
    """A chord of ``members`` squares piped as a list into ``total``, created in the store: the
    broker, the middleware, the record and the first step's messages."""
    broker, workflows, square, total = workflow_broker(store)
    record, first = annotate(
        "chord", [Step([square.message(i) for i in range(members)], pipe="list"), Step([total.message()])]
    )
    workflows.backend.create(record, TTL)
    return broker, workflows, record, first


def cancellation_broker(store: StateStore) -> tuple[RecordingBroker, Cancellation, Any]:
    cancellation = Cancellation(store, keep_ms=TTL, poll_interval=0.05)
    broker = RecordingBroker(middleware=[cancellation])
    job = dramatiq.actor(broker=broker, actor_name="job", queue_name="q")(lambda: None)
    return broker, cancellation, job


def wait_until(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


class DedupingBroker(RecordingBroker):
    """Answers a duplicate send as the project's broker does."""

    def enqueue(self, message: Any, *, delay: Any = None) -> Any:
        from middleware.idempotency import DuplicateMessage, as_duplicate

        try:
            return super().enqueue(message, delay=delay)
        except DuplicateMessage as duplicate:
            return as_duplicate(message, duplicate.original_message_id)


def keyed_workflow_broker(store: StateStore) -> tuple[DedupingBroker, Any, Workflows, Any, Any]:
    """Idempotency and Workflows in the stack's order; ``square`` keyed by its argument."""
    from middleware.idempotency import Idempotency

    idempotency, workflows = Idempotency(store), Workflows(store, ttl_ms=TTL, cancel_ttl_ms=TTL)
    broker = DedupingBroker(middleware=[idempotency, workflows])
    square = dramatiq.actor(
        broker=broker, actor_name="square", queue_name="q", idempotency_key=lambda i: f"square-{i}"
    )(lambda i: i * i)
    total = dramatiq.actor(
        broker=broker, actor_name="total", queue_name="q", idempotency_key=lambda results: "total"
    )(lambda results: None)
    return broker, idempotency, workflows, square, total


#: The marks' TTL (``CANCEL_TTL_MS``) of the tests whose steps arrive after their marks expired.
SHORT = 200


def short_marks_broker(store: StateStore) -> tuple[RecordingBroker, Cancellation, Workflows, Any, Any]:
    """Cancellation and Workflows whose cancels mark for ``SHORT`` ms; the ``square`` and
    ``total`` actors. The cancellation poller polls when a test says (no thread of its own)."""
    cancellation = Cancellation(store, keep_ms=SHORT, poll_interval=60)
    cancellation.watch.start = lambda: None  # type: ignore[method-assign]
    workflows = Workflows(store, ttl_ms=TTL, cancel_ttl_ms=SHORT)
    broker = RecordingBroker(middleware=[cancellation, workflows])
    square = dramatiq.actor(broker=broker, actor_name="square", queue_name="q")(lambda i: i * i)
    total = dramatiq.actor(broker=broker, actor_name="total", queue_name="q")(lambda result: None)
    return broker, cancellation, workflows, square, total


def arrives_cancelled(
    store: StateStore, broker: RecordingBroker, cancellation: Cancellation, message: Any
) -> Any:
    """``message`` arriving once its mark expired, at a worker whose poller is up to date (and
    knows no mark): skipped as cancelled, or the test fails. Returns the delivery."""
    marks, workflow_id = cancel_marks(store), message.options[WORKFLOW]["id"]
    wait_until(lambda: not marks.cancelled_among([message.message_id, (message.message_id, workflow_id)]))
    cancellation.watch.poll_once()
    assert cancellation.watch.known(message.message_id) is False
    arrived = delivery(message)
    with pytest.raises(SkipMessage, match="cancelled"):
        cancellation.before_process_message(broker, arrived)
    assert arrived.options[CANCELLED] is True
    return arrived
