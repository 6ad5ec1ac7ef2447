"""Bare Dramatiq for the baseline: its default RabbitmqBroker and middleware, one no-op actor."""

from __future__ import annotations

import os

import dramatiq
from dramatiq.brokers.rabbitmq import RabbitmqBroker

broker = RabbitmqBroker(url=os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F"))
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name=os.environ.get("BENCH_QUEUE", "bench-bare"))
def noop() -> None:
    """Do nothing: what is measured is the machinery around it."""
