"""The record a dead letter carries, and the flags that keep a failing publish from losing a message.

RabbitMQ dead-letters a rejected message *as last delivered*: its ``options.traceback`` is the
previous attempt's, and the final error exists only in the worker's memory. So the project's
consumer does not let RabbitMQ dead-letter failed messages itself: it publishes a copy to the
dead-letter exchange carrying :func:`DeadLetters.record` as AMQP headers (visible in the
management UI), waits for the confirm, and only then acks the original. When that publish fails
the delivery is requeued instead: a duplicate at worst, never a loss.

Header names are stable and documented (``x-dl-*``); values are scrubbed by the ``scrub``
callable given to the middleware, so no personal data lands in the headers. Building a record never
fails, whatever the message holds: a field that is missing or of the wrong type is left empty.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import dramatiq
from dramatiq import Message
from dramatiq.broker import Broker, MessageProxy
from dramatiq.errors import ActorNotFound
from dramatiq.middleware import AgeLimit, Middleware, Retries, SkipMessage
from dramatiq.middleware.time_limit import TimeLimitExceeded

from jobsystem.runtime.follow_ups import DeadLetterFollowUp, FollowUp, RetryFollowUp
from jobsystem.runtime.message_shape import Malformed, int_option

#: Why a message ended in the dead letters.
REASONS = (
    "retries_exhausted",
    "non_retryable",
    "time_limit",
    "age_limit",
    "unknown_actor",
    "malformed",
    "rejected",
    "undecodable",  # bodies RabbitMQ dead-lettered itself, before the consumer checked shapes
)

HEADER_REASON = "x-dl-reason"
HEADER_EXCEPTION = "x-dl-exception"
HEADER_ERROR = "x-dl-error"
HEADER_TRACEBACK = "x-dl-traceback"
HEADER_ATTEMPTS = "x-dl-attempts"
HEADER_QUEUE = "x-dl-queue"
HEADER_ACTOR = "x-dl-actor"
HEADER_ENQUEUED_AT = "x-dl-enqueued-at"
HEADER_FAILED_AT = "x-dl-failed-at"
#: Of a malformed message: the field that is wrong (``options.retries``); ``x-dl-error`` says how.
HEADER_FIELD = "x-dl-field"
#: The exception type a malformed message's record names.
MALFORMED_EXCEPTION = "MalformedMessage"

#: Message option counting the attempts that reached the actor (kept across retries).
ATTEMPTS = "attempts"
#: Message option: how many times the message was replayed from the dead letters (status records
#: order a replay's attempts after the dead attempt they follow).
REPLAYS = "replays"
#: Attribute set on a message proxy whose follow-up publish failed: requeue it, do not ack it. It
#: holds the follow-up to publish again (a :data:`FollowUp`), or True when none was decided.
_REDELIVER = "_redeliver"
#: Attribute set on a message proxy by a middleware that rejects it, naming the reason; the
#: consumer sets it too once the dead letter is confirmed, so later hooks can log the reason.
DEAD_LETTER_REASON = "_dead_letter_reason"
#: Attribute set on a message proxy by a middleware that rejects it because of an error (a key or
#: rate-limit function that raised): the dead letter records that error, not the SkipMessage.
_DEAD_LETTER_ERROR = "_dead_letter_error"


def request_redelivery(message: MessageProxy, follow_up: FollowUp | None = None) -> None:
    """Ask the consumer to requeue ``message`` instead of acking it: its ``follow_up`` (the retry
    or dead letter its attempt decided) was not published."""
    setattr(message, _REDELIVER, follow_up or True)


def wants_redelivery(message: MessageProxy) -> bool:
    return bool(getattr(message, _REDELIVER, False))


def pending_follow_up(message: MessageProxy) -> FollowUp | None:
    """The follow-up of ``message`` that could not be published, if one was decided."""
    follow_up = getattr(message, _REDELIVER, None)
    return follow_up if isinstance(follow_up, RetryFollowUp | DeadLetterFollowUp) else None


def reject(message: MessageProxy, reason: str, *, error: BaseException | None = None) -> None:
    """Fail ``message`` for good from a middleware, naming the reason its dead letter records and,
    when an error is the cause, that error (its type, scrubbed message and traceback)."""
    setattr(message, DEAD_LETTER_REASON, reason)
    if error is not None:
        setattr(message, _DEAD_LETTER_ERROR, error)
    message.fail()


def _iso(millis: float) -> str:
    return datetime.fromtimestamp(millis / 1000, UTC).isoformat(timespec="milliseconds")


def _identity(text: str) -> str:
    return text


def _safely(compute: Callable[[], Any], default: str = "") -> str:
    """``compute()`` as text that AMQP can carry, or ``default`` if it fails or is not text."""
    try:
        value = compute()
    except Exception:
        return default
    if not isinstance(value, str):
        return default
    return value.encode("utf-8", "replace").decode("utf-8")


class DeadLetters(Middleware):
    """Counts attempts and builds the record of a message's final failure.

    Parameters:
      scrub: applied to the exception message and traceback before they are written to headers.
      max_traceback: characters of traceback kept (the tail, where the error is).
    """

    def __init__(self, *, scrub: Callable[[str], str] = _identity, max_traceback: int = 8_000) -> None:
        self.scrub = scrub
        self.max_traceback = max_traceback

    @property
    def actor_options(self) -> set[str]:
        return {"on_dead_letter"}

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        message.options[ATTEMPTS] = int_option(message.options, ATTEMPTS) + 1

    def notify(self, broker: Broker, message: MessageProxy, headers: dict[str, Any]) -> Message[Any] | None:
        """Send the actor named by the option ``on_dead_letter`` (message or actor) a message about
        ``message``'s dead letter: its id, actor, reason, exception type, scrubbed error, and the
        job's own args and kwargs (so the application can tell its user which job failed)."""
        target = message.options.get("on_dead_letter")
        if target is None:
            try:
                target = broker.get_actor(message.actor_name).options.get("on_dead_letter")
            except ActorNotFound:
                return None
        if not target:
            return None
        hook = broker.get_actor(target)
        kwargs = {
            "message_id": message.message_id,
            "actor": message.actor_name,
            "reason": headers[HEADER_REASON],
            "exception": headers[HEADER_EXCEPTION],
            "error": headers[HEADER_ERROR],
            "args": list(message.args),
            "kwargs": dict(message.kwargs),
        }
        return broker.enqueue(hook.message_with_options(kwargs=kwargs))

    def reason(self, broker: Broker, message: MessageProxy, exception: BaseException | None) -> str:
        """Why ``message`` failed for good, from what the worker knows of its last attempt."""
        explicit = getattr(message, DEAD_LETTER_REASON, None)
        if explicit:
            return str(explicit)
        if isinstance(exception, ActorNotFound):
            return "unknown_actor"
        if isinstance(exception, TimeLimitExceeded):
            return "time_limit"
        if exception is None or isinstance(exception, SkipMessage):
            return "age_limit" if self._too_old(broker, message) else "rejected"
        if isinstance(exception, _throws(broker, message)):
            return "non_retryable"
        return "retries_exhausted"

    def _too_old(self, broker: Broker, message: MessageProxy) -> bool:
        max_age = message.options.get("max_age")
        if max_age is None:
            try:
                max_age = broker.get_actor(message.actor_name).options.get("max_age")
            except ActorNotFound:
                max_age = None
        if max_age is None:
            max_age = next((m.max_age for m in broker.middleware if isinstance(m, AgeLimit)), None)
        return max_age is not None and message.message_timestamp + int(max_age) < time.time() * 1000

    def record(self, broker: Broker, message: Any, exception: BaseException | None) -> dict[str, Any]:
        """The AMQP headers of ``message``'s dead letter: final error (scrubbed), attempts, reason,
        origin and times. Never fails: a field it cannot read is left empty."""
        error = exception if exception is not None and not isinstance(exception, SkipMessage) else None
        error = getattr(message, _DEAD_LETTER_ERROR, None) or error
        trace = _safely(lambda: "".join(traceback.format_exception(error))) if error is not None else ""
        return {
            HEADER_REASON: _safely(lambda: self.reason(broker, message, exception), "rejected"),
            HEADER_EXCEPTION: type(error).__name__ if error is not None else "",
            HEADER_ERROR: _safely(lambda: self.scrub(str(error))[:1_000]) if error is not None else "",
            HEADER_TRACEBACK: _safely(lambda: self.scrub(trace)[-self.max_traceback :]),
            HEADER_ATTEMPTS: int_option(getattr(message, "options", None), ATTEMPTS),
            HEADER_QUEUE: _safely(lambda: dramatiq.common.q_name(message.queue_name)),
            HEADER_ACTOR: _safely(lambda: message.actor_name),
            HEADER_ENQUEUED_AT: _safely(lambda: _iso(message.message_timestamp)),
            HEADER_FAILED_AT: _iso(time.time() * 1000),
        }

    def malformed_record(self, queue_name: str, malformed: Malformed) -> dict[str, Any]:
        """The headers of a body that is not a well-formed message: what is wrong (never the
        value), where it came from, and what could be read of it; no attempt reached an actor."""
        enqueued = malformed.message_timestamp
        return {
            HEADER_REASON: "malformed",
            HEADER_EXCEPTION: MALFORMED_EXCEPTION,
            HEADER_ERROR: str(malformed),
            HEADER_FIELD: malformed.field,
            HEADER_TRACEBACK: "",
            HEADER_ATTEMPTS: 0,
            HEADER_QUEUE: dramatiq.common.q_name(queue_name),
            HEADER_ACTOR: malformed.actor_name or "",
            HEADER_ENQUEUED_AT: _safely(lambda: _iso(enqueued)) if enqueued is not None else "",
            HEADER_FAILED_AT: _iso(time.time() * 1000),
        }


def _throws(broker: Broker, message: Message[Any] | MessageProxy) -> tuple[type[BaseException], ...]:
    throws = message.options.get("throws")
    if throws is None:
        try:
            throws = broker.get_actor(message.actor_name).options.get("throws")
        except ActorNotFound:
            throws = None
    if throws is None:
        return ()
    return throws if isinstance(throws, tuple) else (throws,)


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

    Dramatiq swallows the error when re-enqueueing a retry fails (after its own publish attempts),
    and the worker then acks the original: the message is gone (Dramatiq PR #545). Here the
    delivery is flagged for redelivery instead, carrying the retry (attempt counted), which the
    consumer publishes again once the delivery comes back rather than running the actor again.
    """

    def after_process_message(
        self,
        broker: Broker,
        message: MessageProxy,
        *,
        result: Any | None = None,
        exception: BaseException | None = None,
    ) -> None:
        recorder = _RetryRecorder(broker)
        try:
            super().after_process_message(recorder, message, result=result, exception=exception)  # type: ignore[no-untyped-call]
        except Exception:
            self.logger.exception("retry_publish_failed")
            request_redelivery(message, recorder.retry)
