"""This project's stack for the comparison: `import actors` (broker, middleware) and no-op actors."""

from __future__ import annotations

import os
import time

import dramatiq
import redis
from dramatiq.middleware import CurrentMessage

import actors  # noqa: F401 - builds the project's broker and middleware

QUEUE = os.environ.get("BENCH_QUEUE", "bench-project")
#: Where ``paced_noop`` notes its start times (a list the bench reads, then deletes).
STARTS_KEY = os.environ.get("BENCH_STARTS_KEY", "bench:starts")
#: Where ``latency_probe`` notes its send -> start delays (read with BLPOP by the bench).
LATENCY_KEY = os.environ.get("BENCH_LATENCY_KEY", "bench:latency")
_starts = redis.Redis.from_url(os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14"))


@dramatiq.actor(queue_name=QUEUE)
def noop() -> None:
    """Do nothing: what is measured is the machinery around it."""


@dramatiq.actor(actor_name="keyed_noop", queue_name=QUEUE, idempotency_key=lambda i: f"bench-{i}")
def keyed_noop(i: int) -> None:
    """Do nothing under an idempotency key: one claim before, one deferred completion after."""


@dramatiq.actor(actor_name="metered_noop", queue_name=QUEUE, rate_limit="bench-open")
def metered_noop() -> None:
    """Do nothing, after taking a token from a bucket that never runs dry: the take's cost."""


@dramatiq.actor(actor_name="paced_noop", queue_name=QUEUE, rate_limit="bench-paced")
def paced_noop() -> None:
    """Note the start time: the bench measures the pace the bucket allowed."""
    _starts.rpush(STARTS_KEY, f"{time.time():.6f}")


@dramatiq.actor(
    actor_name="keyed_metered_noop",
    queue_name=QUEUE,
    idempotency_key=lambda i: f"bench-{i}",
    rate_limit="bench-open",
)
def keyed_metered_noop(i: str) -> None:
    """Do nothing under an idempotency key after taking a token of a bucket that never runs dry."""


@dramatiq.actor(
    actor_name="latency_probe",
    queue_name=QUEUE,
    idempotency_key=lambda sent_at, key: f"bench-latency-{key}",
    rate_limit="bench-open",
)
def latency_probe(sent_at: float, key: str) -> None:
    """Note how long after ``sent_at`` (the sender's clock, same host) the job started."""
    _starts.rpush(LATENCY_KEY, f"{time.time() - sent_at:.6f}")


@dramatiq.actor(actor_name="timed_noop", queue_name=QUEUE)
def timed_noop() -> None:
    """Note the message id and the start time: the delay bench compares it with the due time."""
    message = CurrentMessage.get_current_message()
    _starts.rpush(STARTS_KEY, f"{message.message_id if message else '-'} {time.time():.6f}")
