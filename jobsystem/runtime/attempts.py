"""Tell what a re-enqueue of the message being processed means: a retry, or a deferral.

Both publish a copy with the same message id and a delay. Retries does it in its
``after_process_message`` once an attempt failed; a middleware that cannot run a message yet
(idempotency: key held elsewhere or store down; a rate limit) does it in ``before_process_message``
and then raises ``SkipMessage``. Options do not tell them apart reliably (a deferred message that
was retried before carries ``retries`` too), but the moment does, per worker thread:

- a middleware placed after Retries sees ``after_process_message`` first, notes a failed attempt
  with :meth:`AttemptTracker.failed`, and a re-enqueue of that id with a delay is then the retry;
- any other re-enqueue of a message id with a delay that is followed by a skip of the same id is
  a deferral: the message waits in the delay queue and will be tried again, it was not skipped;
- so is a :class:`DeferringSkip`, whose middleware re-enqueues the message in its own
  ``after_skip_message``: Dramatiq calls ``after_*`` hooks in reverse order, so the middleware
  placed after it see the skip before the re-enqueue;
- a re-enqueue with a delay of the message whose attempt this thread is running (noted with
  :meth:`AttemptTracker.started`), not its retry, is such a deferral: the attempt ran again later;
- a retry RabbitMQ refused is published later by the consumer, on its own thread, through
  :func:`enqueue_retry`: every tracker sees that re-enqueue as the retry.

The notes are cleared when the message is acked or nacked, the last thing that happens to it in
the worker thread.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Literal

from dramatiq import Broker, Message
from dramatiq.middleware import SkipMessage

__all__ = ["AttemptTracker", "DeferringSkip", "enqueue_retry"]

#: Per thread: the id of the retry :func:`enqueue_retry` is publishing, if any.
_retrying = threading.local()


def enqueue_retry(broker: Broker, message: Message[Any], delay: int) -> Message[Any]:
    """Enqueue ``message``, the retry of an attempt that failed earlier (its first publish was
    refused), so that the middleware count it as the retry, not as a delayed send."""
    _retrying.message_id = message.message_id
    try:
        return broker.enqueue(message, delay=delay)
    finally:
        _retrying.message_id = None


class DeferringSkip(SkipMessage):
    """A skip whose message the middleware handling it re-enqueues with a delay, from its
    ``after_skip_message`` (an actor's ``RateLimited``): it is a deferral, not a final skip."""


class AttemptTracker:
    """Per worker thread notes about the message being processed (see the module docstring)."""

    def __init__(self) -> None:
        self._local = threading.local()

    def started(self, message_id: str, attempt: int) -> None:
        """This thread runs attempt number ``attempt`` of ``message_id``."""
        self._local.running = (message_id, attempt)

    def running(self, message_id: str) -> int | None:
        """The attempt of ``message_id`` this thread runs, if it runs one."""
        running: tuple[str, int] | None = getattr(self._local, "running", None)
        return running[1] if running is not None and running[0] == message_id else None

    def failed(self, message_id: str) -> None:
        """The attempt of ``message_id`` failed: a re-enqueue of it now is the retry."""
        self._local.failed = message_id

    def enqueued(self, message: Any, delay: int | None) -> Literal["retry", "delayed", "sent"]:
        """Classify an ``after_enqueue``: the retry of the failed attempt, another delayed enqueue
        (a deferral when the same id is skipped next, or a send with a delay), or a plain send."""
        if delay is None:
            return "sent"
        if message.message_id == getattr(self._local, "failed", None):
            self._local.failed = None
            return "retry"
        if message.message_id == getattr(_retrying, "message_id", None):
            return "retry"
        self._local.delayed = message.message_id
        return "delayed"

    def deferred(self, message_id: str) -> bool:
        """Whether ``message_id``, being skipped, was re-enqueued with a delay by this thread, or
        will be by the middleware whose :class:`DeferringSkip` is being handled."""
        if getattr(self._local, "delayed", None) == message_id:
            return True
        return isinstance(sys.exc_info()[1], DeferringSkip)

    def done(self) -> None:
        """The message was acked or nacked: forget the notes."""
        self._local.failed = None
        self._local.delayed = None
        self._local.running = None
