"""Review of workflows under faults (strict xfails: each fails today because of the fault named in
its reason, and passes once it is fixed). In process, on both store backends.

- a chord member dropped at launch as a duplicate hands the next step ``None`` for its result;
- a launch whose publish is refused midway leaves a workflow running that the caller has no id of;
- a group relaunched with the same keys runs its ``on_finish`` before any member ran;
- each member carries the whole next step: a group followed by a group grows as their product."""

from __future__ import annotations

from typing import Any

import dramatiq
import pytest

from jobsystem.runtime.workflow_steps import Step, annotate
from jobsystem.store import StateStore
from jobsystem.workflows import group, pipeline, workflow_status
from middleware.workflows import Workflows
from tests.unit.stub import RecordingBroker, delivery
from tests.unit.workflow_brokers import TTL, keyed_workflow_broker, workflow_broker


def fault(reason: str) -> pytest.MarkDecorator:
    """A fault found by the review: the test fails until it is fixed (then it must pass)."""
    return pytest.mark.xfail(strict=True, reason=reason)


def _sent(broker: RecordingBroker) -> list[tuple[str, tuple[Any, ...]]]:
    return [(m.actor_name, tuple(m.args)) for m, _ in broker.enqueued]


@fault(
    "_launch counts a member dropped as a duplicate at send as succeeded with result None: "
    "the chord's next step gets None in place of that member's result (the original run's result "
    "is in its idempotency key), which the README says a workflow never does",
)
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


@fault(
    "group.run() records the workflow, then a refused publish raises before workflow_id is "
    "set: the members already sent run, the rest never will, the workflow stays 'running' until its "
    "TTL and its on_finish never runs, and the caller has no id to cancel or inspect it",
)
def test_a_launch_refused_midway_is_not_left_running_without_an_id(store: StateStore) -> None:
    workflows = Workflows(store, ttl_ms=TTL, cancel_ttl_ms=TTL)
    broker = RefusingBroker([workflows], refuse_at=2)
    mail = dramatiq.actor(broker=broker, actor_name="mail", queue_name="q")(lambda to: None)
    summary = dramatiq.actor(broker=broker, actor_name="summary", queue_name="q")(lambda counts: None)
    fan_out = group([mail.message(f"user{i}") for i in range(3)], broker=broker)
    fan_out.on_finish(summary.message_with_options())
    with pytest.raises(ConnectionError):
        fan_out.run()
    assert fan_out.workflow_id is not None
    status = workflow_status(fan_out.workflow_id, broker=broker)
    assert status is not None and status["state"] != "running"


@fault(
    "a group relaunched with the same keys (send_campaign redelivered after its worker was "
    "killed once its bulk send was done) finds every member a duplicate and counts each as "
    "succeeded at once: its on_finish runs before any member ran, and the owner is mailed "
    "'N sent, 0 failed' though one of them ends in the dead letters",
)
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


@fault(
    "every member of a step carries the whole next step in its `workflow` option (and each "
    "of those the step after): a pipeline of group(N) then group(M) publishes N x M message copies, "
    "~49 KB per member at 100 x 100 and ~0.5 GB in all at 1000 x 1000, for one run()",
)
def test_a_member_carries_its_next_steps_in_a_size_that_does_not_grow_with_them(store: StateStore) -> None:
    square, total = workflow_broker(store)[2:]
    fetch, parse = ([square.message(i) for i in range(100)] for _ in "ab")
    _, first = annotate(
        "chord", [Step(fetch, pipe="list"), Step(parse, pipe="list"), Step([total.message()])]
    )
    plain = len(square.message(0).encode())
    assert len(first[0].encode()) < 20 * plain, len(first[0].encode())
