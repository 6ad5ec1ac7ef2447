"""A launch tried again after its publish was refused: the caller's retry (``run(key=...)``
again) or Dramatiq's retry of the launching job (same message id) starts the workflow anew under
the next attempt's id, since the refused one is failed for good (its members cancelled in it). A
workflow that ran and failed (a member failed) is not started anew: a relaunch is that workflow."""

from __future__ import annotations

import dramatiq
import pytest

from jobsystem.store import StateStore
from jobsystem.workflows import group, workflow_status
from middleware.workflows import Workflows
from tests.unit.stub import delivery
from tests.unit.test_workflow_launch_failure import RefusingBroker
from tests.unit.test_workflow_relaunch import running
from tests.unit.workflow_brokers import TTL


def _campaign(broker: RefusingBroker) -> group:
    """Three mails, the actor declared on ``broker`` the first time."""
    mail = broker.actors.get("mail") or dramatiq.actor(broker=broker, actor_name="mail", queue_name="q")(
        lambda to: None
    )
    return group([mail.message(f"user{i}") for i in range(3)], broker=broker)


def _refusing_at(store: StateStore, refuse_at: int = 1) -> tuple[RefusingBroker, Workflows]:
    """RabbitMQ refuses the ``refuse_at``-th publish only (a blocked connection that recovers)."""
    workflows = Workflows(store, ttl_ms=TTL, cancel_ttl_ms=TTL)
    return RefusingBroker([workflows], refuse_at=refuse_at), workflows


def _state(broker: RefusingBroker, workflow_id: str | None) -> str:
    assert workflow_id is not None
    status = workflow_status(workflow_id, broker=broker)
    assert status is not None
    return str(status["state"])


def _launched_for_real(broker: RefusingBroker, fan_out: group, sent: int = 3) -> None:
    """The retried run left a running workflow with every member sent."""
    assert (_state(broker, fan_out.workflow_id), len(broker.enqueued)) == ("running", sent), (
        "the retried launch returned without an error, sending nothing, its workflow failed"
    )


def test_a_keyed_launch_retried_after_a_refused_publish_is_launched(store: StateStore) -> None:
    broker, _ = _refusing_at(store)
    with pytest.raises(ConnectionError) as refused:
        _campaign(broker).run(key="campaign-42")
    retried = _campaign(broker).run(key="campaign-42")  # the caller retries: it returns normally
    _launched_for_real(broker, retried)
    old = getattr(refused.value, "workflow_id", None)
    assert retried.workflow_id != old and _state(broker, old) == "failed"
    again = _campaign(broker).run(key="campaign-42")  # and a relaunch of the retry is the retry
    assert again.workflow_id == retried.workflow_id and len(broker.enqueued) == 3


def test_a_launching_job_retried_after_a_refused_publish_launches_its_workflow(store: StateStore) -> None:
    broker, _ = _refusing_at(store)
    launcher = dramatiq.actor(broker=broker, actor_name="launcher", queue_name="q")(lambda: None).message()
    with running(broker, delivery(launcher)), pytest.raises(ConnectionError):
        _campaign(broker).run()
    with running(broker, delivery(launcher)):  # Retries' copy: same message id, a new delivery
        retried = _campaign(broker).run()
    _launched_for_real(broker, retried)


def test_the_refused_launchs_sent_members_stay_cancelled_and_the_retrys_run(store: StateStore) -> None:
    broker, workflows = _refusing_at(store, refuse_at=2)
    fan_out = _campaign(broker)
    with pytest.raises(ConnectionError):
        fan_out.run(key="campaign-42")
    (sent, _), *_ = broker.enqueued
    old = fan_out.workflow_id
    retried = fan_out.run(key="campaign-42")  # the same objects run again
    _launched_for_real(broker, retried, sent=4)
    new = [m for m, _ in broker.enqueued[1:]]
    assert sent.message_id not in {m.message_id for m in new}, "the retry's member took a cancelled id"
    arrivals = [(sent.message_id, old), *((m.message_id, retried.workflow_id) for m in new)]
    assert workflows.backend.cancelled_among(arrivals) == [True, False, False, False]
    assert _state(broker, old) == "failed"


def test_a_workflow_that_ran_and_failed_is_the_same_workflow_on_relaunch(store: StateStore) -> None:
    broker, workflows = _refusing_at(store, refuse_at=0)  # nothing refused
    first = _campaign(broker).run(key="campaign-42")
    dead = delivery(broker.enqueued[0][0])
    dead.fail()
    workflows.after_nack(broker, dead)  # a member ended in the dead letters: the workflow failed
    assert _state(broker, first.workflow_id) == "failed"
    again = _campaign(broker).run(key="campaign-42")
    assert again.workflow_id == first.workflow_id and len(broker.enqueued) == 3, "started anew"
    assert _state(broker, again.workflow_id) == "failed"
