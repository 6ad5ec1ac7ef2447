"""Dramatiq's Retries, except that a retry RabbitMQ does not take is not lost."""

from __future__ import annotations

from typing import Any

from dramatiq import Message
from dramatiq.broker import Broker, MessageProxy
from dramatiq.middleware import Retries

from jobsystem.dramatiq_internals import request_redelivery
from jobsystem.runtime.cancellation import JobCancelled
from jobsystem.runtime.follow_ups import RetryFollowUp

__all__ = ["SafeRetries"]


class _RetryRecorder:
    """The broker as Retries sees it: the retry it enqueues is noted, to be published again by
    the consumer if RabbitMQ refuses it now."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self.retry: RetryFollowUp | None = None

    def enqueue(self, message: Message[Any], *, delay: int | None = None) -> Message[Any]:
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
    A job interrupted because it was cancelled (``JobCancelled``) is neither retried nor failed:
    it is acked.
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
        recorder = _RetryRecorder(broker)
        try:
            super().after_process_message(recorder, message, result=result, exception=exception)  # type: ignore[no-untyped-call]
        except Exception:
            self.logger.exception("retry_publish_failed")
            request_redelivery(message, recorder.retry)
