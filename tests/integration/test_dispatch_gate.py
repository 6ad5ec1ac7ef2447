"""Keyed deliveries wait for their claim's answer before they reach the worker threads.

On the real RabbitMQ and Redis, with the claims' store calls held back by the test: a keyed
delivery stays out of the work queue until its claim sent ahead is answered, then arrives with
the answer in (its worker thread will not wait); an unkeyed one goes at once; and one answered
after its consumer closed is not handed on (RabbitMQ has it back, as every unacked delivery).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from queue import PriorityQueue
from typing import Any

import pytest

from jobsystem.dramatiq_internals import ConsumerThread
from jobsystem.rabbitmq.consumer import DeadLetteringConsumer
from jobsystem.store.idempotency import ClaimRequest
from middleware.idempotency import Idempotency
from tests import workload
from tests.support import Queues, wait_for


@dataclass
class HeldClaims:
    """The broker's idempotency middleware, its claims' store calls held until ``go`` is set."""

    middleware: Idempotency
    asked: threading.Event
    go: threading.Event

    def settled(self) -> None:
        """Return once the claims' pump has handed on every answer so far: it handles one batch
        at a time, callbacks included, so a later call's answer comes after them."""
        self.go.set()
        self.middleware.claims.call(ClaimRequest("gate-test:probe", "probe", "probe", 1_000, 1_000))


@pytest.fixture
def held_claims(queues: Queues, monkeypatch: pytest.MonkeyPatch) -> Iterator[HeldClaims]:
    (middleware,) = [m for m in queues.broker.middleware if isinstance(m, Idempotency)]
    held = HeldClaims(middleware, threading.Event(), threading.Event())
    claim_many = middleware.backend.claim_many

    def held_back(requests: list[ClaimRequest]) -> Any:
        held.asked.set()
        assert held.go.wait(30), "the test never let the claims go"
        return claim_many(requests)

    monkeypatch.setattr(middleware.backend, "claim_many", held_back)
    yield held
    held.go.set()


def queued_ids(work: PriorityQueue[Any]) -> list[str]:
    return [item.message.message_id for item in list(work.queue)]


def test_a_keyed_delivery_reaches_the_worker_threads_once_its_claim_is_answered(
    queues: Queues, held_claims: HeldClaims
):
    keyed = queues.send(workload.effect, "gated")
    plain = queues.send(workload.record, "plain")
    work: PriorityQueue[Any] = PriorityQueue()
    consumer = ConsumerThread(
        broker=queues.broker,
        queue_name=queues.name(workload.effect),
        prefetch=4,
        work_queue=work,
        worker_timeout=100,
    )
    consumer.start()
    try:
        wait_for(held_claims.asked.is_set, what="the keyed delivery's claim sent ahead")
        wait_for(lambda: queued_ids(work) == [plain.message_id], what="the unkeyed delivery")
        assert queued_ids(work) == [plain.message_id]  # the keyed one waits for its answer
        held_claims.settled()
        wait_for(lambda: len(work.queue) == 2, what="the keyed delivery, once answered")
        (item,) = [i for i in list(work.queue) if i.message.message_id == keyed.message_id]
        ahead = held_claims.middleware.ahead.take(item.message)
        assert ahead is not None
        assert held_claims.middleware.claims.wait(ahead.pending, timeout=0).status == "claimed"
    finally:
        consumer.stop()
        consumer.join(30)
        consumer.close()


def test_a_delivery_answered_after_its_consumer_closed_is_not_handed_on(
    queues: Queues, held_claims: HeldClaims
):
    queue = queues.name(workload.effect)
    keyed = queues.send(workload.effect, "too-late")
    consumer = queues.broker.consume(queue, prefetch=4, timeout=100)
    assert isinstance(consumer, DeadLetteringConsumer)
    handed_on: list[str] = []
    consumer.dispatch = lambda message: handed_on.append(message.message_id)  # a consumer thread's
    try:
        wait_for(lambda: next(consumer) is None and held_claims.asked.is_set(), what="the claim sent ahead")
        held_claims.settled()
        assert handed_on == [keyed.message_id]  # open: answered, then handed on

        again = queues.send(workload.effect, "too-late-2")
        held_claims.asked.clear()
        held_claims.go.clear()
        wait_for(lambda: next(consumer) is None and held_claims.asked.is_set(), what="the second claim")
    finally:
        consumer.close()
    held_claims.settled()
    assert handed_on == [keyed.message_id]  # closed: the second is not handed on
    wait_for(lambda: queues.depth(queue) == 2, what="both deliveries back in the queue")
    assert again.message_id not in handed_on


def test_the_claim_of_a_delivery_dropped_at_close_is_given_back(queues: Queues, held_claims: HeldClaims):
    """A lost connection closes the consumer while a claim sent ahead is on its way: once granted,
    the delivery is dropped, and its claim given back, so the copy RabbitMQ redelivers (here, a
    claim by another delivery of the same key) is granted now, not after this one's lease."""
    queue = queues.name(workload.effect)
    dropped = queues.send(workload.effect, "given-back")
    consumer = queues.broker.consume(queue, prefetch=4, timeout=100)
    assert isinstance(consumer, DeadLetteringConsumer)
    handed_on: list[str] = []
    consumer.dispatch = lambda message: handed_on.append(message.message_id)
    try:
        wait_for(lambda: next(consumer) is None and held_claims.asked.is_set(), what="the claim sent ahead")
    finally:
        consumer.close()
    held_claims.settled()  # granted after the close: the delivery is dropped
    middleware = held_claims.middleware
    assert middleware.writes.flush(10)
    assert handed_on == []
    key = middleware.key_of(queues.broker, dropped)
    assert key is not None
    (claim,) = middleware.backend.claim_many(
        [ClaimRequest(key, "redelivered", "another-owner", 30_000, 60_000)]
    )
    assert claim.status == "claimed"
    wait_for(lambda: queues.depth(queue) == 1, what="the delivery back in the queue")
