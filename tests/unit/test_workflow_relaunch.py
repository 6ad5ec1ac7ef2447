"""A launch is idempotent: a group or pipeline launched again (its launching job redelivered, the
same ``key``, or the same members' idempotency keys) is the same workflow. It sends nothing once
the first launch sent its whole first step, else only the members not counted yet (each keyed,
so a copy of one sent runs once), and never counts a member as done before it ran."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import dramatiq
import pytest
from dramatiq.middleware import CurrentMessage

from jobsystem.store import StateStore
from jobsystem.workflows import group, pipeline, workflow_status
from middleware.workflows import Workflows
from tests.unit.stub import RecordingBroker, delivery
from tests.unit.workflow_brokers import TTL, keyed_workflow_broker, workflow_broker


def _sent(broker: RecordingBroker) -> list[tuple[str, tuple[Any, ...]]]:
    return [(m.actor_name, tuple(m.args)) for m, _ in broker.enqueued]


@contextmanager
def running(broker: RecordingBroker, message: Any) -> Iterator[None]:
    """``message``'s delivery being run by this thread (what ``CurrentMessage`` answers)."""
    current = CurrentMessage()
    current.before_process_message(broker, message)  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        current.after_process_message(broker, message)  # type: ignore[no-untyped-call]


def test_a_relaunched_groups_summary_waits_for_the_members_it_found_already_sent(store: StateStore) -> None:
    from middleware.idempotency import Idempotency
    from tests.unit.workflow_brokers import DedupingBroker

    workflows = Workflows(store, ttl_ms=TTL, cancel_ttl_ms=TTL)
    broker = DedupingBroker(middleware=[Idempotency(store), workflows])
    mail = dramatiq.actor(broker=broker, actor_name="mail", queue_name="q", idempotency_key=lambda to: to)(
        lambda to: None
    )
    summary = dramatiq.actor(broker=broker, actor_name="summary", queue_name="q")(lambda counts: None)

    def launch() -> None:
        fan_out = group([mail.message("ana"), mail.message("bob")], broker=broker)
        fan_out.on_finish(summary.message_with_options())
        fan_out.run()

    launch()
    ana, bob = (m for m, _ in broker.enqueued)
    launch()  # the actor that launched it runs again: both members are duplicates
    assert [actor for actor, _ in _sent(broker)] == ["mail", "mail"], "a summary before any mail ran"
    workflows.after_process_message(broker, delivery(ana), result=None)
    dead = delivery(bob)
    dead.fail()
    workflows.after_nack(broker, dead)
    counts = [args[0] for actor, args in _sent(broker) if actor == "summary"]
    assert counts and all(c == {"succeeded": 1, "dead": 1, "cancelled": 0} for c in counts), counts


def _fan_out(broker: RecordingBroker, square: Any, total: Any) -> group:
    fan_out = group([square.message(i) for i in range(3)], broker=broker)
    fan_out.on_finish(total.message_with_options(pipe_ignore=True))
    return fan_out


def test_a_group_launched_by_a_job_redelivered_is_not_launched_again(store: StateStore) -> None:
    broker, _, square, total = workflow_broker(store)
    launcher = square.message(0)
    with running(broker, delivery(launcher)):
        first = _fan_out(broker, square, total).run()
        other = _fan_out(broker, square, total).run()  # its second launch: another workflow
    with running(broker, delivery(launcher, redelivered=True)):  # its worker was killed
        again = _fan_out(broker, square, total).run()
    assert first.workflow_id == again.workflow_id != other.workflow_id
    assert [m.message_id for m in again.children] == [m.message_id for m in first.children]
    assert len(broker.enqueued) == 6, _sent(broker)


def test_a_group_run_again_with_its_key_is_the_same_workflow(store: StateStore) -> None:
    broker, _, square, total = workflow_broker(store)
    fan_out = _fan_out(broker, square, total)
    given = [m.message_id for m in fan_out.children]
    first = fan_out.run(key="campaign-7")
    again = _fan_out(broker, square, total).run(key="campaign-7")
    other = _fan_out(broker, square, total).run(key="campaign-8")
    assert first.workflow_id == again.workflow_id != other.workflow_id
    assert len(broker.enqueued) == 6
    # The first launch keeps the ids its caller gave; the relaunch takes them.
    assert [m.message_id for m in first.children] == given == [m.message_id for m in again.children]
    with pytest.raises(ValueError, match="other steps"):
        group([square.message(1)], broker=broker).run(key="campaign-7")


class Killed(BaseException):
    """The launching worker stopped mid-send (an interrupt, not a refused publish)."""


def test_a_launch_interrupted_midway_is_completed_by_its_relaunch(store: StateStore) -> None:
    broker, workflows, square, total = workflow_broker(store)
    publish = broker.enqueue

    def dies_at_the_third(message: Any, *, delay: Any = None) -> Any:
        if len(broker.enqueued) == 2:
            raise Killed()
        return publish(message, delay=delay)

    broker.enqueue = dies_at_the_third  # type: ignore[method-assign]
    with pytest.raises(Killed):
        _fan_out(broker, square, total).run(key="campaign-7")
    broker.enqueue = publish  # type: ignore[method-assign]
    ran, _ = broker.enqueued[0]
    workflows.after_process_message(broker, delivery(ran), result=0)
    flow = _fan_out(broker, square, total).run(key="campaign-7")
    resent = [m for m, _ in broker.enqueued[2:]]
    # Not the member counted; the one maybe sent again carries a key, so its copy runs once.
    assert [m.message_id for m in resent] == [m.message_id for m in flow.children[1:]]
    assert all(m.options["idempotency_key"] == f"workflow-step:{m.message_id}" for m in resent)
    for member in resent:
        workflows.after_process_message(broker, delivery(member), result=None)
    assert _sent(broker)[-1] == ("total", ())
    workflows.after_process_message(broker, delivery(broker.enqueued[-1][0]), result=None)
    status = workflow_status(str(flow.workflow_id), broker=broker)
    assert status is not None and status["state"] == "succeeded"


def _pipeline_actors(broker: Any) -> tuple[Any, Any]:
    notify = dramatiq.actor(broker=broker, actor_name="notify", queue_name="q")(lambda to, result: None)
    archive = dramatiq.actor(broker=broker, actor_name="archive", queue_name="q")(lambda where, result: None)
    return notify, archive


def test_two_pipelines_sharing_a_keyed_first_member_are_two_workflows(store: StateStore) -> None:
    """The members'-keys id covered only the first step: another pipeline was taken for a
    relaunch of the first one, and its own next step never ran."""
    broker, _, _, square, _ = keyed_workflow_broker(store)
    notify, archive = _pipeline_actors(broker)
    first = pipeline([square.message(2), notify.message("ana")], broker=broker).run()
    second = pipeline([square.message(2), archive.message("s3")], broker=broker).run()
    other = pipeline([square.message(2), notify.message("bob")], broker=broker).run()  # other arguments
    assert second.workflow_id is not None
    status = workflow_status(second.workflow_id, broker=broker)
    assert status is not None
    nexts = [member["actor"] for member in status["steps"][1]["members"]]
    assert nexts == ["archive"], f"the second pipeline is the first one's record: next step {nexts}"
    assert len({first.workflow_id, second.workflow_id, other.workflow_id}) == 3


def test_a_pipeline_launched_again_with_the_same_keyed_steps_is_the_same_workflow(store: StateStore) -> None:
    broker, _, _, square, _ = keyed_workflow_broker(store)
    notify, _ = _pipeline_actors(broker)
    first = pipeline([square.message(2), notify.message("ana")], broker=broker).run()
    again = pipeline([square.message(2), notify.message("ana")], broker=broker).run()
    assert first.workflow_id == again.workflow_id and len(broker.enqueued) == 1


def test_a_relaunch_under_the_same_key_with_other_actors_is_refused(store: StateStore) -> None:
    broker, _, square, _ = workflow_broker(store)
    notify, archive = _pipeline_actors(broker)
    pipeline([square.message(2), notify.message("ana")], broker=broker).run(key="report-7")
    with pytest.raises(ValueError, match="other steps"):
        pipeline([square.message(2), archive.message("s3")], broker=broker).run(key="report-7")
