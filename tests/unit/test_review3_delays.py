"""Review 3, delays and retry backoffs of any length: faults found by reading, each held by a strict
xfail that passes once the fault is fixed (see the reason of each).

- ``JOB_MAX_BACKOFF_MS`` and ``JOB_MIN_BACKOFF_MS`` may be up to ten years ("any length: backoffs
  past DELAY_HORIZON_MS wait in RabbitMQ"), but Dramatiq's ``Retries``, which ``SafeRetries``
  calls, caps the maximum at its own default, 7 days: a longer maximum is never reached, and a
  minimum above 7 days gives a first retry shorter than that minimum (3.5 to 7 days).
- A retry whose delay is past the cascade's reach (an actor's ``Retry(delay=...)`` given a due
  time in epoch milliseconds instead of a delay) cannot be published: ``SafeRetries`` flags the
  delivery for redelivery with that retry decided, and the consumer tries to publish the same
  retry at every redelivery, refused every time, for ever; it neither runs nor is dead-lettered.
"""

from __future__ import annotations

from typing import Any

import dramatiq
import pytest
from dramatiq import Message, Retry

from jobsystem.dramatiq_internals import ProjectMessage, pending_follow_up, wants_redelivery
from jobsystem.rabbitmq.broker import ProjectBroker
from jobsystem.rabbitmq.delays import MAX_DELAY_MS
from middleware.retries import SafeRetries
from tests.unit.stub import RecordingBroker

DAY_MS = 86_400_000


def failed_attempt(retries: int) -> ProjectMessage:
    """A delivery of ``job`` whose attempt number ``retries + 1`` just raised."""
    options = {"retries": retries} if retries else {}
    return ProjectMessage(
        False, 1, Message(queue_name="q", actor_name="job", args=(), kwargs={}, options=options)
    )


@pytest.mark.xfail(
    strict=True,
    reason="Dramatiq's Retries caps max_backoff at 7 days (min(max_backoff, DEFAULT_MAX_BACKOFF)): "
    "JOB_MIN_BACKOFF_MS / JOB_MAX_BACKOFF_MS above 7 days are not honoured",
)
@pytest.mark.parametrize(
    ("retries", "low", "high"),
    [
        (0, 10 * DAY_MS, 20 * DAY_MS),  # the first retry: min_backoff x [1, 2)
        (10, 15 * DAY_MS, 30 * DAY_MS),  # a capped one: drawn from 50-100 % of max_backoff
    ],
)
def test_a_backoff_past_seven_days_keeps_the_configured_minimum_and_maximum(
    retries: int, low: int, high: int
) -> None:
    """README, *Settings*: ``JOB_MIN_BACKOFF_MS`` is the "first retry delay", ``JOB_MAX_BACKOFF_MS``
    the "cap of the retry delay (a capped backoff is drawn from 50-100 % of it); any length".
    Both are accepted up to ten years (``MAX_DURATION_MS``)."""
    broker = RecordingBroker()
    dramatiq.actor(broker=broker, actor_name="job", queue_name="q")(lambda: None)
    safe = SafeRetries(max_retries=20, min_backoff=10 * DAY_MS, max_backoff=30 * DAY_MS)
    safe.after_process_message(broker, failed_attempt(retries), exception=RuntimeError("partner down"))
    ((_, delay),) = broker.enqueued
    assert delay is not None
    assert low <= delay <= high, f"retried in {delay / DAY_MS:.1f} days"


@pytest.mark.xfail(
    strict=True,
    reason="a retry delay past the delay cascade's reach is held for redelivery by SafeRetries "
    "and refused again at every redelivery, for ever: neither run nor dead-lettered",
)
def test_a_retry_delay_past_the_cascade_is_dead_lettered_not_held_for_ever(monkeypatch: Any) -> None:
    """The brief's rule for delays of any length: each either runs at the right time or goes to the
    dead letters with a clear reason. ``ProjectBroker._schedule`` raises ValueError for a delay
    past ``MAX_DELAY_MS`` (17 years) before publishing anything; ``SafeRetries`` takes every error
    of the retry's publish for a refusal by RabbitMQ and flags the delivery for redelivery with
    the retry decided (``RetryFollowUp``); the consumer's ``_publish_decided`` then publishes that
    same retry at each redelivery, which raises the same ValueError: ``follow_up_publish_refused``
    at ERROR every 30 s, the job never run, never dead-lettered."""
    broker = ProjectBroker(environment="", url="amqp://127.0.0.1:1/", middleware=[])
    published: list[tuple[Message[Any], int | None]] = []

    def publish(message: Message[Any], delay: int | None, exchange: str, key: str, *, cascade: bool) -> Any:
        published.append((message, delay))  # RabbitMQ stood in for: a publish that would be taken
        return message

    monkeypatch.setattr(broker, "_publish", publish)
    dramatiq.actor(broker=broker, actor_name="job", queue_name="q")(lambda: None)
    attempt = failed_attempt(0)
    # The classic slip: a due time (ms since 1970) given where a delay is meant.
    SafeRetries(max_retries=5).after_process_message(
        broker, attempt, exception=Retry(delay=MAX_DELAY_MS + DAY_MS)
    )
    held = pending_follow_up(attempt)
    assert not wants_redelivery(attempt), f"held for redelivery with {type(held).__name__}"
    assert attempt.failed or published
