"""DeadLetters: counts attempts and builds the record a dead letter carries.

RabbitMQ dead-letters a message as last delivered, without its final error, so the project's
consumer publishes each dead letter itself with :meth:`DeadLetters.record` as ``x-dl-*`` AMQP
headers (stable, documented names; values scrubbed), and acks the original only once RabbitMQ
confirmed it (``docs/architecture.md``, "Dead letters"). Building a record never fails, whatever
the message holds: a field that is missing or of the wrong type is left empty.
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
from dramatiq.middleware import AgeLimit, Middleware, SkipMessage
from dramatiq.middleware.time_limit import TimeLimitExceeded

from jobsystem.dramatiq_internals import dead_letter_error, dead_letter_reason
from jobsystem.runtime.actor_names import actor_label, unnamed_actor_not_found
from jobsystem.runtime.message_shape import Malformed, int_option
from jobsystem.runtime.options import option_of

__all__ = [
    "ATTEMPTS",
    "HEADER_ACTOR",
    "HEADER_ATTEMPTS",
    "HEADER_ENQUEUED_AT",
    "HEADER_ENVIRONMENT",
    "HEADER_ERROR",
    "HEADER_EXCEPTION",
    "HEADER_FAILED_AT",
    "HEADER_FIELD",
    "HEADER_QUEUE",
    "HEADER_REASON",
    "HEADER_TRACEBACK",
    "MALFORMED_EXCEPTION",
    "REASONS",
    "REPLAYS",
    "DeadLetters",
]

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
#: The ``QUEUE_PREFIX`` of the environment whose worker wrote the dead letter (stamped by the
#: broker as it publishes it): the operator tools change only their own environment's letters.
HEADER_ENVIRONMENT = "x-dl-environment"
#: Of a malformed message: the field that is wrong (``options.retries``); ``x-dl-error`` says how.
HEADER_FIELD = "x-dl-field"
#: The exception type a malformed message's record names.
MALFORMED_EXCEPTION = "MalformedMessage"

#: Message option counting the attempts that reached the actor (kept across retries).
ATTEMPTS = "attempts"
#: Message option: how many times the message was replayed from the dead letters (status records
#: order a replay's attempts after the dead attempt they follow).
REPLAYS = "replays"


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
        job's own args and kwargs (so the application can tell its user which job failed).

        The actor is labelled as everywhere else (:func:`actor_label` with the broker's actors):
        a name no registered actor has is the sender's text, possibly a person's, and ``unknown``
        here, though the hook is the application's own code: a hook logs or alerts with it."""
        target = option_of(broker, message, "on_dead_letter")
        if not target:
            return None
        hook = broker.get_actor(target)
        kwargs = {
            "message_id": message.message_id,
            "actor": actor_label(message.actor_name, broker.actors),
            "reason": headers[HEADER_REASON],
            "exception": headers[HEADER_EXCEPTION],
            "error": headers[HEADER_ERROR],
            "args": list(message.args),
            "kwargs": dict(message.kwargs),
        }
        return broker.enqueue(hook.message_with_options(kwargs=kwargs))

    def reason(self, broker: Broker, message: MessageProxy, exception: BaseException | None) -> str:
        """Why ``message`` failed for good, from what the worker knows of its last attempt."""
        explicit = dead_letter_reason(message)
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
        max_age = option_of(broker, message, "max_age")
        if max_age is None:
            max_age = next((m.max_age for m in broker.middleware if isinstance(m, AgeLimit)), None)
        return max_age is not None and message.message_timestamp + int(max_age) < time.time() * 1000

    def record(self, broker: Broker, message: Any, exception: BaseException | None) -> dict[str, Any]:
        """The AMQP headers of ``message``'s dead letter: final error (scrubbed), attempts, reason,
        origin and times. Never fails: a field it cannot read is left empty."""
        error = exception if exception is not None and not isinstance(exception, SkipMessage) else None
        error = dead_letter_error(message) or error
        if isinstance(error, ActorNotFound):  # its message is the name looked up: the sender's text
            error = unnamed_actor_not_found(error)
        trace = _safely(lambda: "".join(traceback.format_exception(error))) if error is not None else ""
        return {
            HEADER_REASON: _safely(lambda: self.reason(broker, message, exception), "rejected"),
            HEADER_EXCEPTION: type(error).__name__ if error is not None else "",
            HEADER_ERROR: _safely(lambda: self.scrub(str(error))[:1_000]) if error is not None else "",
            HEADER_TRACEBACK: _safely(lambda: self.scrub(trace)[-self.max_traceback :]),
            HEADER_ATTEMPTS: int_option(getattr(message, "options", None), ATTEMPTS),
            HEADER_QUEUE: _safely(lambda: dramatiq.common.q_name(message.queue_name)),
            HEADER_ACTOR: actor_label(_safely(lambda: message.actor_name), broker.actors),
            HEADER_ENQUEUED_AT: _safely(lambda: _iso(message.message_timestamp)),
            HEADER_FAILED_AT: _iso(time.time() * 1000),
        }

    def malformed_record(self, broker: Broker, queue_name: str, malformed: Malformed) -> dict[str, Any]:
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
            HEADER_ACTOR: actor_label(malformed.actor_name, broker.actors),
            HEADER_ENQUEUED_AT: _safely(lambda: _iso(enqueued)) if enqueued is not None else "",
            HEADER_FAILED_AT: _iso(time.time() * 1000),
        }


def _throws(broker: Broker, message: Message[Any] | MessageProxy) -> tuple[type[BaseException], ...]:
    throws = option_of(broker, message, "throws")
    if throws is None:
        return ()
    return throws if isinstance(throws, tuple) else (throws,)
