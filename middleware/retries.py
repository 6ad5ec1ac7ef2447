"""Dramatiq's Retries, except that a retry RabbitMQ does not take is not lost, backoffs keep their
configured bounds whatever their length, and a delay no broker holds dead-letters the job."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from dramatiq import Message, Retry
from dramatiq.broker import Broker, MessageProxy
from dramatiq.common import compute_backoff
from dramatiq.middleware import Retries

from jobsystem.dramatiq_internals import reject, request_redelivery
from jobsystem.runtime.cancellation import JobCancelled
from jobsystem.runtime.delay_range import DelayOutOfRange
from jobsystem.runtime.follow_ups import RetryFollowUp
from jobsystem.runtime.options import option_of

__all__ = ["SafeRetries"]


class _RetryRecorder:
    """The broker as Retries sees it: the retry it enqueues is noted, to be published again by
    the consumer if RabbitMQ refuses it now; its delay is ``backoff(message)`` when given (a
    backoff rather than a ``Retry``'s own delay)."""

    def __init__(self, broker: Broker, backoff: Callable[[Message[Any]], int] | None) -> None:
        self._broker = broker
        self._backoff = backoff
        self.retry: RetryFollowUp | None = None

    def enqueue(self, message: Message[Any], *, delay: int | None = None) -> Message[Any]:
        if self._backoff is not None:
            delay = self._backoff(message)
        self.retry = RetryFollowUp(message.copy(), int(delay or 0))
        return self._broker.enqueue(message, delay=delay)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._broker, name)


class SafeRetries(Retries):
    """Dramatiq's Retries, except that a retry that cannot be published is not lost.

    Parameters: those of Dramatiq's ``Retries`` (``max_retries``, ``min_backoff``, ``max_backoff``,
    ``retry_when``).

    Dramatiq swallows the error when re-enqueueing a retry fails (after its own publish attempts),
    and the worker then acks the original: the message is gone (Dramatiq PR #545). Here the
    delivery is flagged for redelivery instead, carrying the retry (attempt counted), which the
    consumer publishes again once the delivery comes back rather than running the actor again.
    A retry whose delay is longer than the broker holds (:class:`DelayOutOfRange`, raised before
    anything is published) would be refused at every redelivery: the job is dead-lettered instead
    (reason ``rejected``, the error naming the delay). The backoff is :meth:`backoff`, not
    Dramatiq's, which caps every maximum at 7 days. A job interrupted because it was cancelled
    (``JobCancelled``) is neither retried nor failed: it is acked.
    """

    def after_process_message(
        self,
        broker: Broker,
        message: MessageProxy,
        *,
        result: Any | None = None,
        exception: BaseException | None = None,
    ) -> None:
        if isinstance(exception, JobCancelled):
            return
        own_delay = isinstance(exception, Retry) and exception.delay is not None
        recorder = _RetryRecorder(broker, None if own_delay else partial(self.backoff, broker))
        try:
            super().after_process_message(recorder, message, result=result, exception=exception)  # type: ignore[no-untyped-call]
        except DelayOutOfRange as exc:
            self.logger.error("retry_delay_out_of_range")
            reject(message, "rejected", error=exc)
        except Exception:
            self.logger.exception("retry_publish_failed")
            request_redelivery(message, recorder.retry)

    def backoff(self, broker: Broker, message: Message[Any]) -> int:
        """The delay of ``message``'s retry (its ``retries`` already counts it): Dramatiq's
        exponential backoff with jitter (``compute_backoff``: ``min_backoff * 2**n * U[1, 2)``,
        past ``max_backoff`` drawn from 50-100 % of it), then kept between ``min_backoff`` and
        ``max_backoff`` (the message's, else its actor's, else this middleware's), of any length."""
        low = option_of(broker, message, "min_backoff", self.min_backoff)
        high = option_of(broker, message, "max_backoff", self.max_backoff)
        attempts = max(0, int(message.options.get("retries", 1)) - 1)
        _, delay = compute_backoff(attempts, factor=low, max_backoff=high)
        return int(min(max(delay, low), high))
