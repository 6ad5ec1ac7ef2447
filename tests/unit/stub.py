"""In-process stand-ins for the unit tier: a stub broker that notes every enqueue, and deliveries
as the project's consumer makes them."""

from __future__ import annotations

import itertools
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
