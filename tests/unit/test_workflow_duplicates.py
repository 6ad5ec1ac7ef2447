"""A workflow's member dropped at send as the duplicate of an earlier message with its idempotency
key ends as its original did: one that completed hands on the result its key kept (never a
``None`` it was not given); one still pending fails the chord, with the reason, loudly."""

from __future__ import annotations

from typing import Any

from jobsystem.store import StateStore
from jobsystem.workflows import group, pipeline, workflow_status
from middleware.workflows import DUPLICATE_UNFINISHED
from tests.unit.stub import RecordingBroker, delivery
from tests.unit.workflow_brokers import keyed_workflow_broker


def _sent(broker: RecordingBroker) -> list[tuple[str, tuple[Any, ...]]]:
    return [(m.actor_name, tuple(m.args)) for m, _ in broker.enqueued]


def test_a_chord_member_dropped_as_a_duplicate_at_launch_does_not_hand_on_none(store: StateStore) -> None:
    broker, idempotency, workflows, square, total = keyed_workflow_broker(store)
    earlier = broker.enqueue(square.message(2))  # key square-2, sent and run before
    ran = delivery(earlier)
    idempotency.before_process_message(broker, ran)
    idempotency.after_process_message(broker, ran, result=4)
    assert idempotency.writes.flush(10)
    members = [square.message(2), square.message(3)]
    flow = pipeline([group(members, broker=broker), total.message()], broker=broker).run()
    workflows.after_process_message(broker, delivery(broker.enqueued[-1][0]), result=9)
    idempotency.writes.stop()
    totals = [args for actor, args in _sent(broker) if actor == "total"]
    status = workflow_status(str(flow.workflow_id), broker=broker)
    failed = status is not None and status["state"] == "failed"
    assert totals == [([4, 9],)] or (failed and totals == []), totals


def test_a_chord_member_dropped_as_the_duplicate_of_a_pending_message_fails_the_chord(
    store: StateStore,
) -> None:
    """Its original has not run: there is no result to hand on, and its end is not counted here."""
    broker, idempotency, workflows, square, total = keyed_workflow_broker(store)
    broker.enqueue(square.message(2))  # key square-2, sent before and not run yet
    flow = pipeline(
        [group([square.message(2), square.message(3)], broker=broker), total.message()], broker=broker
    )
    flow.run()
    workflows.after_process_message(broker, delivery(broker.enqueued[-1][0]), result=9)
    idempotency.writes.stop()
    status = workflow_status(str(flow.workflow_id), broker=broker)
    assert status is not None and status["state"] == "failed"
    assert status["failed_member"]["reason"] == DUPLICATE_UNFINISHED
    assert [actor for actor, _ in _sent(broker)] == ["square", "square"]  # never total
