"""In-process stand-ins for the unit tier: a stub broker that notes every enqueue, deliveries as the
project's consumer makes them, and a method that notes each call it gets."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from dramatiq import Message
from dramatiq.brokers.stub import StubBroker

from jobsystem.dramatiq_internals import ProjectMessage

_tags = itertools.count(1)


class RecordingBroker(StubBroker):
    """Dramatiq's StubBroker, noting each message enqueued and its delay."""

    def __init__(self, middleware: list[Any] | None = None) -> None:
        super().__init__(middleware=middleware)
        self.enqueued: list[tuple[Message[Any], int | None]] = []

    def enqueue(self, message: Message[Any], *, delay: int | None = None) -> Message[Any]:
        enqueued: Message[Any] = super().enqueue(message, delay=delay)
        self.enqueued.append((enqueued, delay))
        return enqueued


def delivery(message: Message[Any], *, redelivered: bool = False) -> ProjectMessage:
    """``message`` as the project's consumer hands it to the worker."""
    return ProjectMessage(redelivered, next(_tags), message)


def noting_calls(owner: object, method: str, calls: list[str], name: str) -> Callable[..., Any]:
    """Replace ``owner``'s ``method`` by one that notes ``name`` in ``calls`` and then calls it, so
    that a test sees which store calls a path made, in order; returns the method as it was."""
    original: Callable[..., Any] = getattr(owner, method)

    def noted(*args: Any, **kwargs: Any) -> Any:
        calls.append(name)
        return original(*args, **kwargs)

    setattr(owner, method, noted)
    return original
