"""What a workflow step hands on: a member whose result cannot be kept (too large, not JSON) fails
the workflow, named with the reason, instead of handing the next step a ``None`` it would take
for that member's result. On both store backends, in process."""

from __future__ import annotations

from typing import Any

import dramatiq
import pytest

from jobsystem.runtime.idempotency_keys import CompletedDuplicate
from jobsystem.runtime.workflow_steps import Step, annotate
from jobsystem.store import StateStore
from jobsystem.workflows import group, pipeline, workflow_status
from middleware.workflows import Workflows
from tests.unit.stub import RecordingBroker, delivery

TTL = 60_000
LIMIT = 64


def broker_with_limit(store: StateStore) -> tuple[RecordingBroker, Workflows, Any, Any]:
    """A broker with Workflows keeping results up to ``LIMIT`` bytes; ``text(n)`` returns ``n``
    characters, ``total`` gets the step's results."""
    workflows = Workflows(store, ttl_ms=TTL, cancel_ttl_ms=TTL, result_max_bytes=LIMIT)
    broker = RecordingBroker(middleware=[workflows])
    text = dramatiq.actor(broker=broker, actor_name="text", queue_name="q")(lambda n: "x" * n)
    total = dramatiq.actor(broker=broker, actor_name="total", queue_name="q")(lambda results: None)
    return broker, workflows, text, total


def run_first_step(broker: RecordingBroker, workflows: Workflows, results: list[Any]) -> None:
    """End each message of the first step (as sent) with its result."""
    sent = [m for m, _ in broker.enqueued]
    for message, result in zip(sent, results, strict=True):
        workflows.after_process_message(broker, delivery(message), result=result)


def test_a_chord_member_with_a_result_too_large_fails_the_chord_with_the_reason(store):
    broker, workflows, text, total = broker_with_limit(store)
    members = [text.message(1), text.message(500)]
    flow = pipeline([group(members, broker=broker), total.message()], broker=broker).run()
    run_first_step(broker, workflows, ["x", "x" * 500])
    assert [m.actor_name for m, _ in broker.enqueued] == ["text", "text"]  # no callback with None
    status = workflow_status(str(flow.workflow_id), broker=broker)
    assert status is not None and status["state"] == "failed"
    reason = f"result too large: {len('x' * 500) + 2} bytes > {LIMIT}"
    assert status["failed_member"] == {
        "id": members[1].message_id,
        "actor": "text",
        "queue": "q",
        "state": "failed",
        "reason": reason,
    }
    assert [m["state"] for m in status["steps"][0]["members"]] == ["succeeded", "failed"]
    assert status["steps"][0]["members"][1]["reason"] == reason


def test_a_pipeline_step_whose_result_is_not_json_fails_and_says_so(store):
    broker, workflows, text, total = broker_with_limit(store)
    flow = pipeline([text.message(1), total.message()], broker=broker).run()
    run_first_step(broker, workflows, [{1, 2}])  # a set: not JSON, and no message argument either
    assert len(broker.enqueued) == 1
    status = workflow_status(str(flow.workflow_id), broker=broker)
    assert status is not None and status["state"] == "failed"
    assert status["failed_member"]["reason"] == "result not JSON-encodable (TypeError)"


@pytest.mark.parametrize("callback", ["completion", "finish"])
def test_a_result_too_large_is_harmless_when_no_next_step_gets_it(store, callback):
    """A completion callback ignores the results, a finish callback gets the counts, and a last
    step hands nothing on: a large result there fails nothing."""
    broker, workflows, text, total = broker_with_limit(store)
    fan_out = group([text.message(500)], broker=broker)
    if callback == "completion":
        fan_out.add_completion_callback(total.message())
    else:
        fan_out.on_finish(total.message())
    fan_out.run()
    run_first_step(broker, workflows, ["x" * 500])
    assert [m.actor_name for m, _ in broker.enqueued] == ["text", "total"]
    workflows.after_process_message(broker, delivery(broker.enqueued[1][0]), result="y" * 500)
    status = workflow_status(str(fan_out.workflow_id), broker=broker)
    assert status is not None and status["state"] == "succeeded"


def test_a_duplicate_whose_key_kept_no_result_fails_the_step_rather_than_hand_on_none(store):
    """The member's run completed its idempotency key without a result (too large for the key)
    and was not counted (the store did not answer); its redelivery is skipped as a duplicate,
    with no result to hand on: the step must not be sent with ``None``."""
    broker, workflows, text, total = broker_with_limit(store)
    record, first = annotate("chord", [Step([text.message(500)], pipe="list"), Step([total.message()])])
    workflows.backend.create(record, TTL)
    again = delivery(first[0], redelivered=True)
    try:
        raise CompletedDuplicate(None)
    except CompletedDuplicate:  # Dramatiq calls the skip hooks inside its except block
        workflows.after_skip_message(broker, again)
    assert broker.enqueued == []
    found = workflows.backend.get(record["id"])
    assert found is not None and found.state == "failed" and found.failed == first[0].message_id
    assert "not kept" in found.reasons[first[0].message_id]
