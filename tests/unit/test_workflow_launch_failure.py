"""A launch whose publish is refused part-way: the caller gets the workflow's id (on the group and
on the error), the workflow is recorded failed naming the member not sent, and the members
already sent are marked cancelled in it, so none of them runs and no ``on_finish`` follows."""

from __future__ import annotations

from typing import Any

import dramatiq
import pytest

from jobsystem.runtime.workflow_steps import WORKFLOW
from jobsystem.store import StateStore
from jobsystem.workflows import group, workflow_status
from middleware.workflows import Workflows
from tests.unit.stub import RecordingBroker
from tests.unit.workflow_brokers import TTL


class RefusingBroker(RecordingBroker):
    """Refuses the ``refuse_at``-th publish (counting from 1), as RabbitMQ under an alarm or a
    ``reject-publish`` max-length policy does."""

    def __init__(self, middleware: list[Any], refuse_at: int) -> None:
        super().__init__(middleware=middleware)
        self.refuse_at, self.publishes = refuse_at, 0

    def enqueue(self, message: Any, *, delay: Any = None) -> Any:
        self.publishes += 1
        if self.publishes == self.refuse_at:
            raise ConnectionError("RabbitMQ refused the publish")
        return super().enqueue(message, delay=delay)


def _campaign(store: StateStore, refuse_at: int) -> tuple[RefusingBroker, Workflows, group]:
    workflows = Workflows(store, ttl_ms=TTL, cancel_ttl_ms=TTL)
    broker = RefusingBroker([workflows], refuse_at=refuse_at)
    mail = dramatiq.actor(broker=broker, actor_name="mail", queue_name="q")(lambda to: None)
    summary = dramatiq.actor(broker=broker, actor_name="summary", queue_name="q")(lambda counts: None)
    fan_out = group([mail.message(f"user{i}") for i in range(3)], broker=broker)
    fan_out.on_finish(summary.message_with_options())
    return broker, workflows, fan_out


def test_a_launch_refused_midway_is_not_left_running_without_an_id(store: StateStore) -> None:
    _, _, fan_out = _campaign(store, refuse_at=2)
    with pytest.raises(ConnectionError):
        fan_out.run()
    assert fan_out.workflow_id is not None
    status = workflow_status(fan_out.workflow_id, broker=fan_out.broker)
    assert status is not None and status["state"] != "running"


def test_a_refused_launch_names_the_member_not_sent_and_stops_those_sent(store: StateStore) -> None:
    broker, workflows, fan_out = _campaign(store, refuse_at=2)
    with pytest.raises(ConnectionError) as raised:
        fan_out.run()
    workflow_id = fan_out.workflow_id
    assert workflow_id is not None and getattr(raised.value, "workflow_id", None) == workflow_id
    status = workflow_status(workflow_id, broker=broker)
    assert status is not None and status["state"] == "failed"
    unsent = status["steps"][0]["members"][1]
    assert unsent["state"] == "failed" and "ConnectionError" in unsent["reason"]
    (sent, _), *more = broker.enqueued
    assert more == [] and sent.options[WORKFLOW]["id"] == workflow_id
    # The member sent before the refusal is skipped as cancelled when it arrives.
    assert workflows.backend.cancelled_among([(sent.message_id, workflow_id)]) == [True]
