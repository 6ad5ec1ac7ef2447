"""Review of the idempotent workflow launch (``jobsystem.workflow_launch``): faults found.

- A launch whose publish was refused is recorded ``failed`` under its derived id; the same launch
  tried again (the caller's retry with the same ``key``, or Dramatiq's retry of the launching job,
  which keeps its message id) finds that failed record, sends nothing and returns as if launched.
- Two different pipelines whose first members carry the same idempotency keys derive the same id:
  the second is taken for a relaunch of the first, and its own next step never runs.
"""

from __future__ import annotations

from typing import Any

import dramatiq
import pytest

from jobsystem.store import StateStore
from jobsystem.workflows import group, pipeline, workflow_status
from middleware.workflows import Workflows
from tests.unit.stub import delivery
from tests.unit.test_workflow_launch_failure import RefusingBroker
from tests.unit.test_workflow_relaunch import running
from tests.unit.workflow_brokers import TTL, keyed_workflow_broker


def _campaign(broker: RefusingBroker) -> group:
    """Three mails, the actor declared on ``broker`` the first time."""
    mail = broker.actors.get("mail") or dramatiq.actor(broker=broker, actor_name="mail", queue_name="q")(
        lambda to: None
    )
    return group([mail.message(f"user{i}") for i in range(3)], broker=broker)


def _refusing_once(store: StateStore) -> RefusingBroker:
    """RabbitMQ refuses the first publish only (a blocked connection that recovers)."""
    return RefusingBroker([Workflows(store, ttl_ms=TTL, cancel_ttl_ms=TTL)], refuse_at=1)


def _launched_for_real(broker: RefusingBroker, fan_out: group) -> None:
    """Either the retried run raised, or it left a running workflow with every member sent."""
    assert fan_out.workflow_id is not None
    status = workflow_status(fan_out.workflow_id, broker=broker)
    assert status is not None
    assert (status["state"], len(broker.enqueued)) == ("running", 3), (
        "the retried launch returned without an error, sending nothing, its workflow failed"
    )


@pytest.mark.xfail(
    strict=True,
    reason="run(key=...) retried after a refused publish finds the failed record: sends nothing, no error",
)
def test_a_keyed_launch_retried_after_a_refused_publish_is_launched(store: StateStore) -> None:
    broker = _refusing_once(store)
    with pytest.raises(ConnectionError):
        _campaign(broker).run(key="campaign-42")
    retried = _campaign(broker).run(key="campaign-42")  # the caller retries: it returns normally
    _launched_for_real(broker, retried)


@pytest.mark.xfail(
    strict=True,
    reason="a job retried after its launch's publish was refused derives the same id: nothing is sent",
)
def test_a_launching_job_retried_after_a_refused_publish_launches_its_workflow(store: StateStore) -> None:
    broker = _refusing_once(store)
    launcher = dramatiq.actor(broker=broker, actor_name="launcher", queue_name="q")(lambda: None).message()
    with running(broker, delivery(launcher)), pytest.raises(ConnectionError):
        _campaign(broker).run()
    with running(broker, delivery(launcher)):  # Retries' copy: same message id, a new delivery
        retried = _campaign(broker).run()
    _launched_for_real(broker, retried)


def _actors(broker: Any) -> tuple[Any, Any]:
    notify = dramatiq.actor(broker=broker, actor_name="notify", queue_name="q")(lambda to, result: None)
    archive = dramatiq.actor(broker=broker, actor_name="archive", queue_name="q")(lambda where, result: None)
    return notify, archive


@pytest.mark.xfail(
    strict=True,
    reason="the members'-keys basis ignores the later steps: another pipeline is taken for a relaunch",
)
def test_two_pipelines_sharing_a_keyed_first_member_are_two_workflows(store: StateStore) -> None:
    broker, _, _, square, _ = keyed_workflow_broker(store)
    notify, archive = _actors(broker)
    first = pipeline([square.message(2), notify.message("ana")], broker=broker).run()
    second = pipeline([square.message(2), archive.message("s3")], broker=broker).run()
    assert second.workflow_id is not None
    status = workflow_status(second.workflow_id, broker=broker)
    assert status is not None
    nexts = [member["actor"] for member in status["steps"][1]["members"]]
    assert nexts == ["archive"], f"the second pipeline is the first one's record: next step {nexts}"
    assert first.workflow_id != second.workflow_id
