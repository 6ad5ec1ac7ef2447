"""Bare Dramatiq for the baseline: its default RabbitmqBroker and middleware, one no-op actor and
the latency probe; ``BENCH_MAX_PRIORITY`` gives its queues ``x-max-priority``, as the project's have."""

from __future__ import annotations

import os
import time

import dramatiq
import redis
from dramatiq.brokers.rabbitmq import RabbitmqBroker

#: ``x-max-priority`` of the queues (unset: plain queues, as Dramatiq declares them by default).
_MAX_PRIORITY = os.environ.get("BENCH_MAX_PRIORITY")
broker = RabbitmqBroker(
    url=os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F"),
    max_priority=int(_MAX_PRIORITY) if _MAX_PRIORITY else None,
)
dramatiq.set_broker(broker)
QUEUE = os.environ.get("BENCH_QUEUE", "bench-bare")
LATENCY_KEY = os.environ.get("BENCH_LATENCY_KEY", "bench:latency")
_latencies = redis.Redis.from_url(os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14"))


@dramatiq.actor(queue_name=QUEUE)
def noop() -> None:
    """Do nothing: what is measured is the machinery around it."""


@dramatiq.actor(queue_name=QUEUE)
def latency_probe(sent_at: float, key: str) -> None:
    """Note how long after ``sent_at`` (the sender's clock, same host) the job started."""
    _latencies.rpush(LATENCY_KEY, f"{time.time() - sent_at:.6f}")
