"""Scrub the tracebacks Dramatiq stores in a message's options before the message is published.

Retries writes ``traceback.format_exc()`` (exception messages included) into
``options["traceback"]`` and re-enqueues the message; RabbitMQ keeps that body in the delay queue
and, once retries run out, in the dead letters, and sends the failed message's dict, options and
all, to an ``on_retry_exhausted`` hook actor. ``before_enqueue`` runs just before the body is
encoded (also for the retry's copy), so scrubbing there keeps personal data out of the broker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from dramatiq import Message
from dramatiq.broker import Broker
from dramatiq.middleware import Middleware

__all__ = ["ScrubStoredTracebacks"]


class ScrubStoredTracebacks(Middleware):
    """Replace string options (``traceback`` by default) with ``scrub(value)`` at enqueue time.

    Parameters:
      scrub: the text scrubber.
      options: the names of the options scrubbed.

    Place it last in the stack: ``before_enqueue`` runs in list order, so it then sees every option
    the other middleware wrote.
    """

    def __init__(self, scrub: Callable[[str], str], options: Iterable[str] = ("traceback",)) -> None:
        self.scrub = scrub
        self.options = tuple(options)

    def before_enqueue(self, broker: Broker, message: Message[Any], delay: int | None) -> None:
        self._scrub_options(message.options)
        for argument in message.args:
            # Retries' on_retry_exhausted hook is sent the failed message's dict, traceback included.
            if isinstance(argument, dict) and isinstance(argument.get("options"), dict):
                self._scrub_options(argument["options"])

    def _scrub_options(self, options: dict[str, Any]) -> None:
        for name in self.options:
            value = options.get(name)
            if isinstance(value, str):
                options[name] = self.scrub(value)
