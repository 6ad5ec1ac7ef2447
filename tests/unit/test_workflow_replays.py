"""A workflow's member that ended in the dead letters and is replayed (``jobctl dlq retry``/replay)
and then succeeds is counted again, as succeeded: its workflow runs on from where it failed and the
next step is sent, as Dramatiq's own pipelines go on from a replayed step. In process, on both
store backends."""

from __future__ import annotations

from typing import Any

from dramatiq import Message

from jobsystem.ops.dead_letter_reader import DeadLetter
from jobsystem.runtime.workflow_steps import Step, annotate
from jobsystem.store import StateStore
from jobsystem.workflows import workflow_status
from tests.unit.stub import RecordingBroker, delivery
from tests.unit.workflow_brokers import TTL, square_chord, workflow_broker


def _sent(broker: RecordingBroker) -> list[tuple[str, tuple[Any, ...]]]:
    return [(m.actor_name, tuple(m.args)) for m, _ in broker.enqueued]


def _dead_lettered(workflows: Any, broker: RecordingBroker, message: Message[Any]) -> None:
    """``message``'s retries were exhausted: it is dead-lettered and counted ``dead``."""
    dead = delivery(message)
    dead.fail()
    workflows.after_nack(broker, dead)


def _replayed(message: Message[Any]) -> Message[Any]:
    """What `jobctl dlq retry` publishes for ``message``'s dead letter, as it reads it from q.DLQ."""
    letter = DeadLetter(
        exception="",
        error="",
        traceback="",
        dead_letter_queue="q.DLQ",
        message_id=message.message_id,
        queue="q",
        actor=message.actor_name,
        reason="retries_exhausted",
        attempts=21,
        enqueued_at=None,
        failed_at=None,
        body=message.encode(),
    )
    replayed = letter.replay_message()
    assert replayed is not None
    return replayed


def test_a_replayed_dead_pipeline_step_hands_on_to_the_rest_of_its_pipeline(store: StateStore) -> None:
    broker, workflows, square, total = workflow_broker(store)
    record, first = annotate(
        "pipeline", [Step([square.message(2)]), Step([square.message()]), Step([total.message()])]
    )
    workflows.backend.create(record, TTL)
    workflows.after_process_message(broker, delivery(first[0]), result=4)
    (step, _), *_ = broker.enqueued
    _dead_lettered(workflows, broker, step)  # the partner API was down
    assert workflow_status(record["id"], broker=broker)["state"] == "failed"  # type: ignore[index]
    workflows.after_process_message(broker, delivery(_replayed(step)), result=16)
    assert _sent(broker)[1:] == [("total", (16,))]
    status = workflow_status(record["id"], broker=broker)
    assert status is not None and status["state"] == "running" and status["failed_member"] is None
    assert status["steps"][1]["members"][0]["state"] == "succeeded"


def test_a_chord_resumes_only_once_every_dead_member_was_replayed(store: StateStore) -> None:
    broker, workflows, record, first = square_chord(store, members=3)
    workflows.after_process_message(broker, delivery(first[0]), result=0)
    _dead_lettered(workflows, broker, first[1])
    _dead_lettered(workflows, broker, first[2])
    workflows.after_process_message(broker, delivery(_replayed(first[1])), result=1)
    status = workflow_status(record["id"], broker=broker)
    assert status is not None and status["state"] == "failed" and broker.enqueued == []
    assert status["failed_member"]["id"] == first[2].message_id
    workflows.after_process_message(broker, delivery(_replayed(first[2])), result=4)
    assert _sent(broker) == [("total", ([0, 1, 4],))]
    found = workflows.backend.get(record["id"])
    assert found is not None and found.state == "running"


def test_a_replayed_dead_last_step_succeeds_its_workflow(store: StateStore) -> None:
    broker, workflows, square, _ = workflow_broker(store)
    record, first = annotate("pipeline", [Step([square.message(2)]), Step([square.message()])])
    workflows.backend.create(record, TTL)
    workflows.after_process_message(broker, delivery(first[0]), result=4)
    (last, _), *_ = broker.enqueued
    _dead_lettered(workflows, broker, last)
    workflows.after_process_message(broker, delivery(_replayed(last)), result=16)
    found = workflows.backend.get(record["id"])
    assert found is not None and found.state == "succeeded" and found.results[last.message_id] == 16


def test_a_dead_member_run_again_without_a_replay_is_not_counted_again(store: StateStore) -> None:
    broker, workflows, record, first = square_chord(store, members=1)
    _dead_lettered(workflows, broker, first[0])
    workflows.after_process_message(broker, delivery(first[0]), result=0)  # a stray redelivery
    found = workflows.backend.get(record["id"])
    assert found is not None and found.state == "failed" and broker.enqueued == []
