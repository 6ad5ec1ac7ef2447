"""A next step the send refuses for good (a middleware's decision: a bad idempotency key, a guard's
no) fails its workflow, naming the member that completed the step, and that member's delivery is
acked: put back, it would run again and be refused again, for ever. A send that fails for an
outage (store, connection) still puts the delivery back. In process, on both store backends."""

from __future__ import annotations

import sqlite3
from typing import Any

import dramatiq
import pytest
from dramatiq.middleware import MiddlewareError

from jobsystem.dramatiq_internals import wants_redelivery
from jobsystem.store import StateStore, StoreUnavailable
from jobsystem.workflows import pipeline, workflow_status
from middleware.guard import GuardError
from middleware.idempotency import Idempotency, IdempotencyKeyError, IdempotencyStoreError
from middleware.workflows import Workflows, refused_for_good
from tests.unit.stub import delivery
from tests.unit.workflow_brokers import TTL, DedupingBroker


def _report_pipeline(store: StateStore) -> tuple[DedupingBroker, Idempotency, Workflows, pipeline]:
    """``fetch`` then ``report``, whose idempotency key reads ``data["id"]`` from what it is handed."""
    idempotency, workflows = Idempotency(store), Workflows(store, ttl_ms=TTL, cancel_ttl_ms=TTL)
    broker = DedupingBroker(middleware=[idempotency, workflows])
    fetch = dramatiq.actor(broker=broker, actor_name="fetch", queue_name="q")(lambda: [1, 2])
    report = dramatiq.actor(
        broker=broker, actor_name="report", queue_name="q", idempotency_key=lambda data: data["id"]
    )(lambda data: None)
    flow = pipeline([fetch.message(), report.message_with_options()], broker=broker).run()
    return broker, idempotency, workflows, flow


def test_a_next_step_refused_for_good_fails_the_workflow_instead_of_rerunning_the_member(
    store: StateStore,
) -> None:
    broker, idempotency, workflows, flow = _report_pipeline(store)
    ran = delivery(broker.enqueued[0][0])
    workflows.after_process_message(broker, ran, result=[1, 2])  # a list: data["id"] raises
    idempotency.writes.stop()
    status = workflow_status(str(flow.workflow_id), broker=broker)
    assert not wants_redelivery(ran), "the member is put back to run again"
    assert status is not None and status["state"] == "failed"
    failed = status["failed_member"]
    assert failed["id"] == ran.message_id and failed["state"] == "failed"
    assert failed["reason"] == "next step refused at send (IdempotencyKeyError)"
    assert status["steps"][1]["members"][0]["state"] == "waiting"


def test_a_next_step_refused_for_an_outage_puts_the_member_back(store: StateStore) -> None:
    broker, idempotency, workflows, flow = _report_pipeline(store)
    ran = delivery(broker.enqueued[0][0])

    def store_down(*args: Any, **kwargs: Any) -> Any:
        try:
            raise StoreUnavailable("redis: timeout")
        except StoreUnavailable as exc:
            raise IdempotencyStoreError("the store did not answer") from exc

    broker.enqueue = store_down  # type: ignore[method-assign]
    workflows.after_process_message(broker, ran, result={"id": 7})
    idempotency.writes.stop()
    status = workflow_status(str(flow.workflow_id), broker=broker)
    assert wants_redelivery(ran)
    assert status is not None and status["state"] == "running"


def _caused(error: MiddlewareError, cause: BaseException) -> MiddlewareError:
    error.__cause__ = cause
    return error


@pytest.mark.parametrize(
    ("error", "for_good"),
    [
        (IdempotencyKeyError("actor 'report': idempotency_key raised KeyError"), True),
        (_caused(GuardError("RateLimits could not check the send"), TypeError("a bug")), True),
        (_caused(GuardError("RateLimits could not check the send"), StoreUnavailable("down")), False),
        (IdempotencyStoreError("the store did not answer"), False),
        (
            _caused(GuardError("Idempotency could not check the send"), sqlite3.OperationalError("locked")),
            False,
        ),
        (ConnectionError("RabbitMQ refused the publish"), False),
        (dramatiq.errors.ConnectionClosed(OSError("reset")), False),  # type: ignore[no-untyped-call]
        (RuntimeError("a bug in the send"), False),
    ],
)
def test_only_a_middlewares_refusal_without_an_outage_is_for_good(error: Exception, for_good: bool) -> None:
    assert refused_for_good(error) is for_good
