"""A workflow member re-enqueued with a delay keeps its workflow's record best-effort: a store that
does not answer never refuses the send (a deferral is how a job waits out that very outage), a
short delay makes no store call, and a consumer's own thread makes none (it would hold up
consuming); a long delay that could outlive the record keeps it when the store answers."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any
from unittest import mock

import dramatiq
import pytest

from jobsystem.dramatiq_internals import wants_redelivery
from jobsystem.rabbitmq.consumer import DeadLetteringConsumer
from jobsystem.runtime.follow_ups import RetryFollowUp
from jobsystem.runtime.requeue import postpone
from jobsystem.store import StateStore, StoreUnavailable
from jobsystem.workflows import group
from middleware.workflows import KEEP_FRACTION, Workflows
from tests.unit.stub import RecordingBroker, delivery
from tests.unit.workflow_brokers import TTL

#: A delay that could outlive the record (see ``Workflows._outlives``), and one that could not.
LONG, SHORT = TTL // KEEP_FRACTION + 1_000, TTL // KEEP_FRACTION - 1_000


def _member(store: StateStore) -> tuple[RecordingBroker, Workflows, list[str], dramatiq.Message[Any]]:
    """A group's member as sent; the store's ``keep`` refused (an outage), its calls noted."""
    workflows = Workflows(store, ttl_ms=TTL, cancel_ttl_ms=TTL)
    broker = RecordingBroker(middleware=[workflows])
    mail = dramatiq.actor(broker=broker, actor_name="mail", queue_name="q")(lambda to: None)
    group([mail.message("ana")], broker=broker).run()
    (member, _), *_ = broker.enqueued
    calls: list[str] = []

    def down(workflow_id: str, step: int, ttl_ms: int) -> None:
        calls.append(workflow_id)
        raise StoreUnavailable("redis: timeout")

    workflows.backend.keep = down  # type: ignore[method-assign]
    return broker, workflows, calls, member


@pytest.mark.parametrize("delay", [SHORT, LONG])
def test_a_workflow_member_deferred_during_a_store_outage_is_re_enqueued(
    store: StateStore, delay: int
) -> None:
    broker, _, _, member = _member(store)
    arrived = delivery(member)
    # What a guard whose claim found the store down does (FailClosed.defer), in one attempt.
    confirmed = postpone(broker, arrived, delay, reason="guard_failed", attempts=1)
    assert confirmed and not wants_redelivery(arrived), (
        "the deferral's copy was refused for the outage it defers: the delivery is put back instead"
    )
    assert len(broker.enqueued) == 2


def test_a_long_delay_the_store_cannot_note_is_sent_and_logged(store: StateStore, caplog: Any) -> None:
    broker, _, calls, member = _member(store)
    with caplog.at_level(logging.INFO, logger="middleware.workflows"):
        broker.enqueue(member.copy(options={"retries": 1}), delay=LONG)
    assert len(calls) == 1 and len(broker.enqueued) == 2
    failed = [r for r in caplog.records if r.getMessage() == "workflow_keep_failed"]
    assert [(r.levelno, getattr(r, "error", None)) for r in failed] == [(logging.WARNING, "StoreUnavailable")]


def test_a_short_delay_makes_no_store_call(store: StateStore) -> None:
    broker, _, calls, member = _member(store)
    broker.enqueue(member.copy(options={"retries": 1}), delay=SHORT)
    assert calls == [] and len(broker.enqueued) == 2


def test_a_long_delay_keeps_the_record_when_the_store_answers(store: StateStore) -> None:
    workflows = Workflows(store, ttl_ms=TTL, cancel_ttl_ms=TTL)
    broker = RecordingBroker(middleware=[workflows])
    mail = dramatiq.actor(broker=broker, actor_name="mail", queue_name="q")(lambda to: None)
    flow = group([mail.message("ana")], broker=broker).run()
    kept: list[tuple[str, int, int]] = []
    keep = workflows.backend.keep
    workflows.backend.keep = lambda *args: kept.append(args) or keep(*args)  # type: ignore[method-assign, func-returns-value]
    broker.enqueue(broker.enqueued[0][0].copy(options={"retries": 1}), delay=LONG)
    assert kept == [(flow.workflow_id, 0, TTL + LONG)]


def test_a_retry_the_consumer_publishes_on_its_thread_makes_no_store_call(store: StateStore) -> None:
    """The consumer publishes a retry RabbitMQ refused when its worker sent it (that send kept the
    record): on the consumer's thread a store timeout would hold up every delivery of its queue."""
    broker, _, calls, member = _member(store)
    consumer: Any = object.__new__(DeadLetteringConsumer)  # no connection: only its decision
    consumer.broker = SimpleNamespace(enqueue=broker.enqueue, refused_follow_ups=mock.Mock())
    consumer.queue_name, consumer._settle = "q", mock.Mock()
    retry = member.copy(options={"retries": 1})
    consumer._publish_decided(7, retry.message_id, RetryFollowUp(retry, LONG))
    assert calls == [] and len(broker.enqueued) == 2
    consumer._settle.assert_called_once()  # published, then acked
