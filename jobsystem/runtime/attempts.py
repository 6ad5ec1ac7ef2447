"""Tell what a re-enqueue of the message being processed means: a retry, or a deferral.

Both publish a copy with the same message id and a delay. Retries does it in its
``after_process_message`` once an attempt failed; a middleware that cannot run a message yet
(idempotency: key held elsewhere or store down; a rate limit) does it in ``before_process_message``
and then raises ``SkipMessage``. Options do not tell them apart reliably (a deferred message that
was retried before carries ``retries`` too), but the moment does, per worker thread:

- a middleware placed after Retries sees ``after_process_message`` first, notes a failed attempt
  with :meth:`AttemptTracker.failed`, and a re-enqueue of that id with a delay is then the retry;
- any other re-enqueue of a message id with a delay that is followed by a skip of the same id is
  a deferral: the message waits in the delay queue and will be tried again, it was not skipped.

The notes are cleared when the message is acked or nacked, the last thing that happens to it in
the worker thread.
"""

from __future__ import annotations

import threading
from typing import Any, Literal


class AttemptTracker:
    """Per worker thread notes about the message being processed (see the module docstring)."""

    def __init__(self) -> None:
        self._local = threading.local()

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
        self._local.delayed = message.message_id
        return "delayed"

    def deferred(self, message_id: str) -> bool:
        """Whether ``message_id``, being skipped, was re-enqueued with a delay by this thread."""
        return getattr(self._local, "delayed", None) == message_id

    def done(self) -> None:
        """The message was acked or nacked: forget the notes."""
        self._local.failed = None
        self._local.delayed = None
