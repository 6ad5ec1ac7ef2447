"""A worker consumes its own actors' queues only: a send to another service's queue (which
declares it on the worker's broker) adds no consumer for it, unless ``--queues`` named it."""

from __future__ import annotations

import dramatiq
from dramatiq.brokers.stub import StubBroker

from middleware.own_queues import OwnQueues


def _worker(queues: set[str] | None = None) -> tuple[StubBroker, dramatiq.Worker]:
    broker = StubBroker(middleware=[OwnQueues()])
    dramatiq.actor(broker=broker, actor_name="mine", queue_name="mine")(lambda: None)
    worker = dramatiq.Worker(broker, worker_threads=1, queues=queues)
    worker.start()
    return broker, worker


def test_a_queue_declared_by_a_send_to_another_service_gets_no_consumer():
    broker, worker = _worker()
    try:
        broker.declare_queue("billing")  # as a send to another service's actor does
        assert set(worker.consumers) == {"mine", "mine.DQ"}
    finally:
        worker.stop()


def test_a_worker_started_with_queues_keeps_its_own_choice():
    broker, worker = _worker({"mine", "billing"})
    try:
        broker.declare_queue("billing")
        assert set(worker.consumers) == {"mine", "mine.DQ", "billing", "billing.DQ"}
    finally:
        worker.stop()
