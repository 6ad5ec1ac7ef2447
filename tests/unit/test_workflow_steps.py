"""The Workflows middleware sends the next step: once, with the results in order, by the member that
completed the step (again when it is redelivered before noting the send), never after a dead
member; duplicates at send end as their originals did; empty groups, first steps' delays, a step's date."""

from __future__ import annotations

import time
from typing import Any

import dramatiq
import pytest

from jobsystem.runtime.workflow_steps import WORKFLOW, Step, annotate
from jobsystem.store import StoreUnavailable
from middleware.workflows import Workflows
from tests.unit.stub import delivery
from tests.unit.workflow_brokers import (
    TTL,
    DedupingBroker,
    keyed_workflow_broker,
    square_chord,
    wait_until,
    workflow_broker,
)


def test_the_last_member_sends_the_next_step_once_with_the_results_in_order(store):
    broker, workflows, _, first = square_chord(store, members=3)
    for i in (2, 0, 1, 1):  # out of order, and member 1 delivered twice
        workflows.after_process_message(broker, delivery(first[i]), result=i * i)
    (sent, delay), *more = broker.enqueued
    assert more == [] and delay is None
    assert sent.actor_name == "total" and sent.args == ([0, 1, 4],)
    assert sent.options["idempotency_key"] == f"workflow-step:{sent.message_id}"
    assert sent.options[WORKFLOW]["step"] == 1


def test_a_dead_member_never_sends_the_next_step(store):
    broker, workflows, record, first = square_chord(store)
    workflows.after_process_message(broker, delivery(first[0]), result=0)
    dead = delivery(first[1])
    dead.fail()
    workflows.after_nack(broker, dead)
    assert broker.enqueued == []
    found = workflows.backend.get(record["id"])
    assert found is not None and (found.state, found.failed) == ("failed", first[1].message_id)


def test_a_dead_member_the_store_could_not_count_is_counted_once_it_answers(store):
    broker, workflows, record, first = square_chord(store)
    workflows.dead_retry_s = 0.05
    answer = workflows.backend.finish
    refusals = iter([StoreUnavailable("redis: ResponseError: OOM"), StoreUnavailable("redis: timeout")])

    def flaky(*args: Any, **kwargs: Any) -> Any:
        refusal = next(refusals, None)
        if refusal is not None:
            raise refusal
        return answer(*args, **kwargs)

    workflows.backend.finish = flaky  # type: ignore[method-assign]
    dead = delivery(first[1])
    dead.fail()
    workflows.after_nack(broker, dead)  # refused twice, then counted in the background
    wait_until(lambda: (found := workflows.backend.get(record["id"])) is not None and found.state == "failed")
    found = workflows.backend.get(record["id"])
    assert found is not None and found.failed == first[1].message_id and broker.enqueued == []


def test_a_store_down_when_counting_puts_the_delivery_back(store):
    from jobsystem.dramatiq_internals import wants_redelivery

    broker, workflows, square, _ = workflow_broker(store)
    _, first = annotate("group", [Step([square.message(1)], pipe="list")])

    def down(*args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable("down")

    workflows.backend.finish = down  # type: ignore[method-assign]
    message = delivery(first[0])
    workflows.after_process_message(broker, message, result=1)
    assert wants_redelivery(message)


def test_a_next_step_whose_publish_failed_is_sent_by_the_redelivered_member(store):
    from jobsystem.dramatiq_internals import wants_redelivery

    broker, workflows, square, total = workflow_broker(store)
    record, first = annotate("chord", [Step([square.message(2)], pipe="list"), Step([total.message()])])
    workflows.backend.create(record, TTL)
    publish = broker.enqueue

    def refused(message: Any, *, delay: Any = None) -> Any:
        raise ConnectionError("RabbitMQ refused the publish")

    broker.enqueue = refused  # type: ignore[method-assign]
    failed = delivery(first[0])
    workflows.after_process_message(broker, failed, result=4)
    assert wants_redelivery(failed)
    broker.enqueue = publish  # type: ignore[method-assign]
    workflows.after_process_message(broker, delivery(first[0], redelivered=True), result=4)
    assert [(m.actor_name, m.args) for m, _ in broker.enqueued] == [("total", ([4],))]


def test_another_member_redelivered_while_the_step_is_being_sent_does_not_send_it_again(store):
    # A worker SIGKILLed after counting a member but before acking it: RabbitMQ redelivers the
    # member, and its run ends while the worker of the last member is sending the next step
    # (between the publish and the note that it was sent). Only the member that completed the
    # step may send it (again, if its own worker died): a second publish would leave a duplicate
    # of the next step in the queue, deferred while the first runs (the integration test's
    # chord-with-a-SIGKILL found one left over).
    broker, workflows, _, first = square_chord(store, members=3)
    for i in (0, 1):
        workflows.after_process_message(broker, delivery(first[i]), result=i * i)
    publish = broker.enqueue

    def publish_during_which_member_0_ends_again(message: Any, *, delay: Any = None) -> Any:
        broker.enqueue = publish  # type: ignore[method-assign]
        workflows.after_process_message(broker, delivery(first[0], redelivered=True), result=0)
        return publish(message, delay=delay)

    broker.enqueue = publish_during_which_member_0_ends_again  # type: ignore[method-assign]
    workflows.after_process_message(broker, delivery(first[2]), result=4)
    assert [(m.actor_name, m.args) for m, _ in broker.enqueued] == [("total", ([0, 1, 4],))]


def test_the_member_that_completed_the_step_sends_it_again_if_its_worker_died_before_noting_it(store):
    broker, workflows, _, first = square_chord(store)
    workflows.after_process_message(broker, delivery(first[0]), result=0)
    died = workflows.backend.mark_sent

    def killed(*args: Any, **kwargs: Any) -> None:
        raise SystemExit("SIGKILL between the publish and the note")

    workflows.backend.mark_sent = killed  # type: ignore[method-assign]
    with pytest.raises(SystemExit):
        workflows.member_finished(broker, delivery(first[1]), "succeeded", 1)
    workflows.backend.mark_sent = died  # type: ignore[method-assign]
    # The other member's redelivery does not send it; the completing member's does.
    workflows.after_process_message(broker, delivery(first[0], redelivered=True), result=0)
    assert len(broker.enqueued) == 1
    workflows.after_process_message(broker, delivery(first[1], redelivered=True), result=1)
    assert [(m.actor_name, m.args) for m, _ in broker.enqueued] == [("total", ([0, 1],))] * 2
    workflows.after_process_message(broker, delivery(first[1], redelivered=True), result=1)
    assert len(broker.enqueued) == 2  # noted as sent now


@pytest.mark.parametrize("original", ["completed", "pending"])
def test_a_member_dropped_as_a_duplicate_at_send_counts_as_its_original_ended(store, original):
    """It will not run here: one whose original completed counts as succeeded (with the result
    its key kept); one whose original has not completed is counted failed, with the reason, not
    as succeeded before anything ran (``on_finish`` gets it in none of its counts)."""
    from jobsystem.workflows import group as workflow_group
    from jobsystem.workflows import workflow_status
    from middleware.idempotency import Idempotency
    from middleware.workflows import DUPLICATE_UNFINISHED

    idempotency, workflows = Idempotency(store), Workflows(store, ttl_ms=TTL, cancel_ttl_ms=TTL)
    broker = DedupingBroker(middleware=[idempotency, workflows])
    mail = dramatiq.actor(broker=broker, actor_name="mail", queue_name="q", idempotency_key=lambda to: to)(
        lambda to: None
    )
    summary = dramatiq.actor(broker=broker, actor_name="summary", queue_name="q")(lambda counts: None)
    ran = delivery(broker.enqueue(mail.message("ana")))  # sent before: the group's "ana" is a duplicate
    if original == "completed":
        idempotency.before_process_message(broker, ran)
        idempotency.after_process_message(broker, ran, result=None)
        assert idempotency.writes.flush(10)
    fan_out = workflow_group([mail.message("ana"), mail.message("bob")], broker=broker)
    fan_out.on_finish(summary.message_with_options())  # on_finish adds its argument
    fan_out.run()
    assert [m.actor_name for m, _ in broker.enqueued] == ["mail", "mail"]  # "ana" once, "bob"
    workflows.after_process_message(broker, delivery(broker.enqueued[-1][0]), result=None)
    idempotency.writes.stop()
    succeeded = 2 if original == "completed" else 1
    assert [(m.actor_name, m.args) for m, _ in broker.enqueued[2:]] == [
        ("summary", ({"succeeded": succeeded, "dead": 0, "cancelled": 0},))
    ]
    status = workflow_status(str(fan_out.workflow_id), broker=broker)
    assert status is not None
    ana = status["steps"][0]["members"][0]
    assert ana["state"] == ("succeeded" if original == "completed" else "failed")
    assert ana.get("reason") == (None if original == "completed" else DUPLICATE_UNFINISHED)


def test_a_keyed_member_whose_next_step_was_refused_sends_it_when_it_comes_back_a_duplicate(store):
    """The member's run completed its key while its next step's publish failed (the delivery was
    put back): when it comes back, its key skips it as a duplicate, and that skip sends the step."""
    from jobsystem.dramatiq_internals import wants_redelivery
    from jobsystem.runtime.idempotency_keys import CompletedDuplicate

    broker, idempotency, workflows, square, total = keyed_workflow_broker(store)
    record, first = annotate("chord", [Step([square.message(2)], pipe="list"), Step([total.message()])])
    workflows.backend.create(record, TTL)
    publish = broker.enqueue

    def refused(message: Any, *, delay: Any = None) -> Any:
        raise ConnectionError("RabbitMQ refused the publish")

    ran = delivery(first[0])
    idempotency.before_process_message(broker, ran)
    broker.enqueue = refused  # type: ignore[method-assign]
    workflows.after_process_message(broker, ran, result=4)  # after hooks: in reverse order
    idempotency.after_process_message(broker, ran, result=4)
    assert wants_redelivery(ran) and idempotency.writes.flush(10)
    broker.enqueue = publish  # type: ignore[method-assign]
    again = delivery(first[0], redelivered=True)
    with pytest.raises(CompletedDuplicate) as skipped:
        idempotency.before_process_message(broker, again)
    try:
        raise skipped.value
    except CompletedDuplicate:  # Dramatiq calls the skip hooks inside its except block
        workflows.after_skip_message(broker, again)
        idempotency.after_skip_message(broker, again)
    assert [(m.actor_name, m.args) for m, _ in broker.enqueued] == [("total", ([4],))]
    idempotency.writes.stop()


@pytest.mark.parametrize("original", ["completed", "pending"])
def test_a_next_step_dropped_as_a_duplicate_at_send_counts_as_its_original_ended(store, original):
    broker, idempotency, workflows, square, total = keyed_workflow_broker(store)
    ran = delivery(broker.enqueue(total.message([0])))  # sent before, with the same key: not run here
    if original == "completed":
        idempotency.before_process_message(broker, ran)
        idempotency.after_process_message(broker, ran, result=None)
        assert idempotency.writes.flush(10)
    record, first = annotate("chord", [Step([square.message(3)], pipe="list"), Step([total.message()])])
    workflows.backend.create(record, TTL)
    workflows.after_process_message(broker, delivery(first[0]), result=9)
    assert [m.actor_name for m, _ in broker.enqueued] == ["total"]  # the one sent before
    found = workflows.backend.get(record["id"])
    assert found is not None and found.state == ("succeeded" if original == "completed" else "failed")
    idempotency.writes.stop()


def test_a_next_step_is_dated_when_it_is_sent_so_an_age_limit_counts_from_there(store):
    """The next step's message was built when the workflow was launched: sent hours later, with
    its launch time as its timestamp, an age limit (``JOB_MAX_AGE_MS``, ``max_age``) shorter than
    the steps before it dead-lettered it as too old the moment it arrived."""
    from dramatiq.middleware import AgeLimit

    from jobsystem.workflows import pipeline as workflow_pipeline

    broker, workflows, square, total = workflow_broker(store)
    flow = workflow_pipeline([square.message(2), total.message_with_options(max_age=300)], broker=broker)
    flow.run()
    time.sleep(0.4)  # the first step runs longer than the next step's age limit
    before = int(time.time() * 1000)
    workflows.after_process_message(broker, delivery(broker.enqueued[0][0]), result=4)
    (sent, _) = broker.enqueued[1]
    assert sent.message_timestamp >= before
    AgeLimit().before_process_message(broker, delivery(sent))  # type: ignore[no-untyped-call]  # young enough: runs


def test_a_group_of_no_members_runs_its_callback_at_once(store):
    """A campaign to an empty segment: with no member to end, nothing ever counted the step and
    its ``on_finish`` callback (the owner's summary) never ran; the workflow ran forever."""
    from jobsystem.workflows import group as workflow_group
    from jobsystem.workflows import workflow_status

    broker, workflows, _, total = workflow_broker(store)
    fan_out = workflow_group([], broker=broker)
    fan_out.on_finish(total.message())
    fan_out.run()
    assert [(m.actor_name, m.args) for m, _ in broker.enqueued] == [
        ("total", ({"succeeded": 0, "dead": 0, "cancelled": 0},))
    ]
    workflows.after_process_message(broker, delivery(broker.enqueued[0][0]), result=None)
    assert workflow_status(str(fan_out.workflow_id), broker=broker)["state"] == "succeeded"  # type: ignore[index]
    workflow_group([], broker=broker).run()  # nothing to run: done at once
    assert len(broker.enqueued) == 1


def test_an_empty_group_in_a_pipeline_hands_the_next_step_an_empty_list(store):
    from jobsystem.workflows import group as workflow_group
    from jobsystem.workflows import pipeline as workflow_pipeline

    broker, workflows, square, total = workflow_broker(store)
    flow = workflow_pipeline(
        [square.message(3), workflow_group([], broker=broker), total.message()], broker=broker
    )
    flow.run()
    workflows.after_process_message(broker, delivery(broker.enqueued[0][0]), result=9)
    assert [(m.actor_name, m.args) for m, _ in broker.enqueued[1:]] == [("total", ([],))]
    workflows.after_process_message(broker, delivery(broker.enqueued[1][0]), result=0)
    found = workflows.backend.get(str(flow.workflow_id))
    assert found is not None and found.state == "succeeded"


def test_a_first_step_keeps_its_own_delay_as_dramatiqs_pipeline_does(store):
    """Dramatiq's ``pipeline.run`` delays the first message by the larger of its own ``delay`` and
    the run's; a next step here keeps its own too. The first step's own delay was dropped: the
    job ran at once."""
    from jobsystem.workflows import pipeline as workflow_pipeline

    broker, workflows, square, total = workflow_broker(store)
    workflows.ttl_ms = 200
    first = square.message_with_options(args=(2,), delay=600)
    flow = workflow_pipeline([first, total.message()], broker=broker).run()
    workflow_pipeline([first, total.message()], broker=broker).run(delay=900)
    workflow_pipeline([square.message(3), total.message()], broker=broker).run(delay=300)
    assert [delay for _, delay in broker.enqueued] == [600, 900, 300]
    time.sleep(0.4)  # past the TTL, within the delay: the record waits for it
    assert workflows.backend.get(str(flow.workflow_id)) is not None


def test_a_message_given_twice_is_refused_not_left_waiting_for_ever(store):
    """``group([m] * 3)``: the three sends share one message id, which the store counts once, so
    the step never completed and its callback never ran (Dramatiq's group runs it). Refused."""
    from jobsystem.workflows import group as workflow_group
    from jobsystem.workflows import pipeline as workflow_pipeline

    broker, _, square, total = workflow_broker(store)
    once = square.message(2)
    fan_out = workflow_group([once] * 3, broker=broker)
    fan_out.add_completion_callback(total.message())
    with pytest.raises(ValueError, match="more than once"):
        fan_out.run()
    with pytest.raises(ValueError, match="more than once"):
        workflow_pipeline(
            [once, workflow_group([once, square.message(3)], broker=broker)], broker=broker
        ).run()
    assert broker.enqueued == []


def test_a_step_sent_again_hands_on_the_result_it_was_counted_with(store):
    """The member's end was counted (result 4) and its worker died before sending the next step.
    Its redelivery ran again and ended another way (here: dead-lettered): the step was then sent
    with that run's result (None), not with the result the step was completed with."""
    broker, workflows, square, total = workflow_broker(store)
    record, first = annotate("pipeline", [Step([square.message(2)]), Step([total.message()])])
    workflows.backend.create(record, TTL)
    workflows.backend.finish(record["id"], 0, first[0].message_id, "succeeded", "4", TTL)  # then died
    again = delivery(first[0], redelivered=True)
    again.fail()
    workflows.after_nack(broker, again)
    assert [(m.actor_name, m.args) for m, _ in broker.enqueued] == [("total", (4,))]


def test_a_step_sent_again_hands_on_a_none_it_was_counted_with(store):
    """The completer returned None (kept as null), its worker died before sending the next step,
    and its redelivery returned 5: ``None`` was read as "no result kept" and 5 handed on. Only a
    result too large to keep (recorded empty) gives way to the later run's."""
    broker, workflows, square, total = workflow_broker(store)
    workflows.result_max_bytes = 8
    for recorded, again, piped in ((None, 5, None), ("too large to keep", 5, 5)):
        record, first = annotate("pipeline", [Step([square.message(2)]), Step([total.message()])])
        workflows.backend.create(record, TTL)
        encoded = workflows._encode(recorded)
        workflows.backend.finish(record["id"], 0, first[0].message_id, "succeeded", encoded, TTL)  # died
        workflows.after_process_message(broker, delivery(first[0], redelivered=True), result=again)
        assert [(m.actor_name, m.args) for m, _ in broker.enqueued[-1:]] == [("total", (piped,))]
