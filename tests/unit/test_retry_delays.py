"""Retry backoffs and delays of any length (found by review 3).

- ``JOB_MAX_BACKOFF_MS`` and ``JOB_MIN_BACKOFF_MS`` may be up to ten years ("any length: backoffs
  past DELAY_HORIZON_MS wait in RabbitMQ"); Dramatiq's ``Retries`` caps the maximum at its own
  default, 7 days, so ``SafeRetries`` computes the backoff itself between the configured bounds.
- A delay past the cascade's reach (an actor's ``Retry(delay=...)`` given a due time in epoch
  milliseconds instead of a delay) cannot be published: the retry dead-letters the job at once
  (it used to be held for redelivery and refused at every redelivery, for ever), and a send
  raises to the caller, publishing nothing.
"""

from __future__ import annotations

from typing import Any

import dramatiq
import dramatiq.common
import pytest
from dramatiq import Message, Retry

from jobsystem.dramatiq_internals import (
    ProjectMessage,
    dead_letter_error,
    dead_letter_reason,
    pending_follow_up,
    wants_redelivery,
)
from jobsystem.rabbitmq.broker import ProjectBroker
from jobsystem.rabbitmq.delays import MAX_DELAY_MS, DelayOutOfRange
from middleware.retries import SafeRetries
from tests.unit.stub import RecordingBroker

DAY_MS = 86_400_000


def failed_attempt(retries: int) -> ProjectMessage:
    """A delivery of ``job`` whose attempt number ``retries + 1`` just raised."""
    options = {"retries": retries} if retries else {}
    return ProjectMessage(
        False, 1, Message(queue_name="q", actor_name="job", args=(), kwargs={}, options=options)
    )


def retried_in(safe: SafeRetries, retries: int) -> int:
    """The delay of the retry ``safe`` publishes after attempt ``retries + 1`` of ``job`` failed."""
    broker = RecordingBroker()
    dramatiq.actor(broker=broker, actor_name="job", queue_name="q")(lambda: None)
    safe.after_process_message(broker, failed_attempt(retries), exception=RuntimeError("partner down"))
    ((_, delay),) = broker.enqueued
    assert delay is not None
    return delay


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
    safe = SafeRetries(max_retries=20, min_backoff=10 * DAY_MS, max_backoff=30 * DAY_MS)
    delay = retried_in(safe, retries)
    assert low <= delay <= high, f"retried in {delay / DAY_MS:.1f} days"


@pytest.mark.parametrize("draw", [0.5, 1.0, 2.0])
def test_a_backoff_never_leaves_its_bounds_whatever_the_jitter_draws(monkeypatch: Any, draw: float) -> None:
    """A capped backoff drawn from 50-100 % of a maximum less than twice the minimum would fall
    below the minimum: it is kept at the minimum; and never past the maximum."""
    monkeypatch.setattr(dramatiq.common, "uniform", lambda a, b: min(max(draw, a), b))
    safe = SafeRetries(max_retries=20, min_backoff=20 * DAY_MS, max_backoff=30 * DAY_MS)
    for retries in (0, 1, 5, 19):
        assert 20 * DAY_MS <= retried_in(safe, retries) <= 30 * DAY_MS


def test_a_backoff_takes_the_bounds_of_the_message_and_its_actor_first() -> None:
    broker = RecordingBroker()
    dramatiq.actor(broker=broker, actor_name="job", queue_name="q", max_backoff=9 * DAY_MS)(lambda: None)
    safe = SafeRetries(max_retries=20, min_backoff=1_000, max_backoff=30 * DAY_MS)
    attempt = failed_attempt(15)
    attempt.options["min_backoff"] = 8 * DAY_MS
    safe.after_process_message(broker, attempt, exception=RuntimeError("partner down"))
    ((_, delay),) = broker.enqueued
    assert delay is not None and 8 * DAY_MS <= delay <= 9 * DAY_MS


def test_a_retry_keeps_the_delay_the_actor_asked_for() -> None:
    broker = RecordingBroker()
    dramatiq.actor(broker=broker, actor_name="job", queue_name="q")(lambda: None)
    SafeRetries(max_retries=5, min_backoff=10 * DAY_MS).after_process_message(
        broker, failed_attempt(0), exception=Retry(delay=1_234)
    )
    assert [delay for _, delay in broker.enqueued] == [1_234]


def cascade_broker(monkeypatch: Any) -> tuple[ProjectBroker, list[tuple[Message[Any], int | None]]]:
    """A ProjectBroker with actor ``job`` whose RabbitMQ publish is stood in for (each taken,
    noted in the list returned)."""
    broker = ProjectBroker(environment="", url="amqp://127.0.0.1:1/", middleware=[])
    published: list[tuple[Message[Any], int | None]] = []

    def publish(message: Message[Any], delay: int | None, exchange: str, key: str, *, cascade: bool) -> Any:
        published.append((message, delay))
        return message

    monkeypatch.setattr(broker, "_publish", publish)
    dramatiq.actor(broker=broker, actor_name="job", queue_name="q")(lambda: None)
    return broker, published


def test_a_retry_delay_past_the_cascade_is_dead_lettered_not_held_for_ever(monkeypatch: Any) -> None:
    """The rule for delays of any length: each either runs at the right time or goes to the
    dead letters with a clear reason. ``ProjectBroker._schedule`` raises ``DelayOutOfRange`` for
    a delay past ``MAX_DELAY_MS`` (17 years) before publishing anything; held for redelivery,
    the consumer would publish the same retry at each redelivery, refused the same way, for ever.
    It is dead-lettered at once instead: reason ``rejected``, the error naming the delay."""
    broker, published = cascade_broker(monkeypatch)
    attempt = failed_attempt(0)
    # The classic slip: a due time (ms since 1970) given where a delay is meant.
    SafeRetries(max_retries=5).after_process_message(
        broker, attempt, exception=Retry(delay=MAX_DELAY_MS + DAY_MS)
    )
    held = pending_follow_up(attempt)
    assert not wants_redelivery(attempt), f"held for redelivery with {type(held).__name__}"
    assert attempt.failed and not published
    assert dead_letter_reason(attempt) == "rejected"
    error = dead_letter_error(attempt)
    assert isinstance(error, DelayOutOfRange) and "at most" in str(error)


def test_a_send_delayed_past_the_cascade_raises_to_the_caller_and_publishes_nothing(
    monkeypatch: Any,
) -> None:
    broker, published = cascade_broker(monkeypatch)
    with pytest.raises(DelayOutOfRange, match="due time"):
        broker.get_actor("job").send_with_options(delay=MAX_DELAY_MS + 1)
    assert published == []
    broker.get_actor("job").send_with_options(delay=MAX_DELAY_MS)  # the longest is taken
    assert [delay for _, delay in published] == [MAX_DELAY_MS]
