"""Review of workflows under faults (strict xfails: each fails today because of the fault named in
its reason, and passes once it is fixed). In process, on both store backends.

- a dead-lettered pipeline step replayed (``jobctl dlq retry``) runs, but its pipeline never goes on;
- ``pipeline.get_result(block=True)`` of a failed or cancelled workflow waits out its timeout;
- a group member retried with a delay longer than the workflow's TTL finds its workflow gone;
- each member carries the whole next step: a group followed by a group grows as their product;
- a next step the send refuses for good re-runs the member that completed its step, for ever."""

from __future__ import annotations

import time
from typing import Any

import dramatiq
import pytest
from dramatiq.results import ResultFailure

from jobsystem.ops.dead_letter_reader import DeadLetter
from jobsystem.runtime.workflow_steps import Step, annotate
from jobsystem.store import StateStore
from jobsystem.store.results import StoreResultBackend
from jobsystem.workflows import cancel, group, pipeline, workflow_status
from middleware.results import StoreResults
from middleware.workflows import Workflows
from tests.unit.stub import RecordingBroker, delivery
from tests.unit.workflow_brokers import TTL, wait_until, workflow_broker


def fault(reason: str) -> pytest.MarkDecorator:
    """A fault found by the review: the test fails until it is fixed (then it must pass)."""
    return pytest.mark.xfail(strict=True, reason=reason)


def _sent(broker: RecordingBroker) -> list[tuple[str, tuple[Any, ...]]]:
    return [(m.actor_name, tuple(m.args)) for m, _ in broker.enqueued]


@fault(
    "a dead-lettered pipeline step replayed with `jobctl dlq retry` runs and succeeds, but "
    "finish() finds it counted (dead) already: the workflow stays failed and the next step is never "
    "sent (Dramatiq's own pipeline carries the rest in the message and goes on)",
)
def test_a_replayed_dead_pipeline_step_hands_on_to_the_rest_of_its_pipeline(store: StateStore) -> None:
    broker, workflows, square, total = workflow_broker(store)
    record, first = annotate(
        "pipeline", [Step([square.message(2)]), Step([square.message()]), Step([total.message()])]
    )
    workflows.backend.create(record, TTL)
    workflows.after_process_message(broker, delivery(first[0]), result=4)
    (step, _), *_ = broker.enqueued
    dead = delivery(step)  # the partner API was down: retries exhausted, dead-lettered
    dead.fail()
    workflows.after_nack(broker, dead)
    letter = DeadLetter(  # as `jobctl dlq retry` reads it from q.DLQ
        exception="",
        error="",
        traceback="",
        dead_letter_queue="q.DLQ",
        message_id=step.message_id,
        queue="q",
        actor="square",
        reason="retries_exhausted",
        attempts=21,
        enqueued_at=None,
        failed_at=None,
        body=step.encode(),
    )
    replayed = letter.replay_message()  # what `jobctl dlq retry` publishes
    assert replayed is not None
    workflows.after_process_message(broker, delivery(replayed), result=16)
    assert _sent(broker)[1:] == [("total", (16,))]
    status = workflow_status(record["id"], broker=broker)
    assert status is not None and status["state"] in ("running", "succeeded")
    assert status["steps"][1]["members"][0]["state"] == "succeeded"


def _results_broker(store: StateStore) -> tuple[RecordingBroker, Workflows, Any, Any]:
    workflows = Workflows(store, ttl_ms=TTL, cancel_ttl_ms=TTL)
    results = StoreResults(StoreResultBackend(store, scrub=lambda text: text), result_ttl=TTL)
    broker = RecordingBroker(middleware=[results, workflows])
    square = dramatiq.actor(broker=broker, actor_name="square", queue_name="q", store_results=True)(
        lambda i: i * i
    )
    total = dramatiq.actor(broker=broker, actor_name="total", queue_name="q", store_results=True)(
        lambda result: result
    )
    return broker, workflows, square, total


@pytest.mark.parametrize("ending", ["dead", "cancelled"])
@fault(
    "pipeline.get_result(block=True) waits for the last step's result only: a workflow that "
    "failed (a dead member) or was cancelled never sends it, so the caller waits out the whole "
    "timeout and gets ResultTimeout, not a failure (Celery's chain.get() raises at once)",
)
def test_a_failed_or_cancelled_pipeline_answers_get_result_with_a_failure(
    store: StateStore, ending: str
) -> None:
    broker, workflows, square, total = _results_broker(store)
    flow = pipeline([square.message(2), total.message()], broker=broker).run()
    (first, _), *_ = broker.enqueued
    if ending == "dead":
        dead = delivery(first)
        dead.fail()
        workflows.after_nack(broker, dead)
    else:
        cancel(str(flow.workflow_id), broker=broker)
    with pytest.raises(ResultFailure):
        flow.get_result(block=True, timeout=3_000)


@fault(
    "a member's delayed re-enqueue (a retry, Retry(delay=...), a deferral) does not lengthen "
    "its workflow's record, which lives RESULT_TTL_MS after its last change: a member retried past "
    "it finds the workflow gone (finish answers 'unknown', logged at INFO) and on_finish never runs",
)
def test_a_group_member_retried_past_the_workflows_ttl_still_finishes_the_group(store: StateStore) -> None:
    ttl_ms, retry_ms = 300, 1_000
    workflows = Workflows(store, ttl_ms=ttl_ms, cancel_ttl_ms=TTL)
    broker = RecordingBroker(middleware=[workflows])
    mail = dramatiq.actor(broker=broker, actor_name="mail", queue_name="q")(lambda to: None)
    summary = dramatiq.actor(broker=broker, actor_name="summary", queue_name="q")(lambda counts: None)
    fan_out = group([mail.message("ana"), mail.message("bob")], broker=broker)
    fan_out.on_finish(summary.message_with_options())
    fan_out.run()
    ana, bob = (m for m, _ in broker.enqueued)
    workflows.after_process_message(broker, delivery(ana), result=None)
    retry = bob.copy(options={"retries": 1})
    broker.enqueue(retry, delay=retry_ms)  # as SafeRetries re-enqueues a failed attempt
    due = time.monotonic() + retry_ms / 1000
    wait_until(lambda: time.monotonic() >= due, timeout=retry_ms / 1000 + 5)
    workflows.after_process_message(broker, delivery(retry), result=None)
    assert ("summary", ({"succeeded": 2, "dead": 0, "cancelled": 0},)) in _sent(broker)


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


@fault(
    "a next step the send refuses for good (its actor's idempotency_key raises on the piped "
    "result: IdempotencyKeyError) fails Workflows' after hook like an outage: the member's delivery "
    "is put back, its actor runs again, the send is refused again, every <= 30 s for ever (logged as "
    "a refused follow-up), and the workflow stays 'running'",
)
def test_a_next_step_refused_for_good_fails_the_workflow_instead_of_rerunning_the_member(
    store: StateStore,
) -> None:
    from jobsystem.dramatiq_internals import wants_redelivery
    from middleware.idempotency import Idempotency
    from tests.unit.workflow_brokers import DedupingBroker

    idempotency, workflows = Idempotency(store), Workflows(store, ttl_ms=TTL, cancel_ttl_ms=TTL)
    broker = DedupingBroker(middleware=[idempotency, workflows])
    fetch = dramatiq.actor(broker=broker, actor_name="fetch", queue_name="q")(lambda: [1, 2])
    report = dramatiq.actor(
        broker=broker, actor_name="report", queue_name="q", idempotency_key=lambda data: data["id"]
    )(lambda data: None)
    flow = pipeline([fetch.message(), report.message_with_options()], broker=broker).run()
    ran = delivery(broker.enqueued[0][0])
    workflows.after_process_message(broker, ran, result=[1, 2])  # a list: data["id"] raises
    idempotency.writes.stop()
    status = workflow_status(str(flow.workflow_id), broker=broker)
    assert not wants_redelivery(ran), "the member is put back to run again"
    assert status is not None and status["state"] == "failed"
