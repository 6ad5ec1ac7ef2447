"""Systems that send under a test's prefix, as an application or a dashboard builds them, and waiting
for what they still write; dead letters published as a worker's consumer does."""

from __future__ import annotations

import os
from typing import Any

import dramatiq

from jobsystem.rabbitmq.broker import ProjectBroker
from jobsystem.system import System, get_system
from tests.support import TEST_REDIS_URL

__all__ = ["flush_senders", "publish_dead_letters", "sender_broker", "sender_system"]

#: The brokers :func:`sender_system` built on the test Redis since :func:`flush_senders` last ran.
_SENDERS: list[ProjectBroker] = []


def sender_system(prefix: str, state_url: str) -> System:
    """A system (a :class:`jobsystem.system.System`) on ``prefix`` and ``state_url``, as an
    application or a dashboard would build it: its broker has the project's middleware and knows
    the project's actors (without rebinding them)."""
    from jobsystem.settings import load_settings
    from jobsystem.system import build_system

    system = build_system(load_settings({**os.environ, "QUEUE_PREFIX": prefix, "STATE_URL": state_url}))
    system.broker.actors.update(get_system().broker.actors)
    if state_url == TEST_REDIS_URL:  # what goes elsewhere (a file, a private Redis) is not shared
        _SENDERS.append(system.broker)
    return system


def sender_broker(prefix: str, state_url: str) -> ProjectBroker:
    """The broker of a :func:`sender_system`."""
    return sender_system(prefix, state_url).broker


def flush_senders(timeout: float = 10.0) -> None:
    """Wait until what the brokers :func:`sender_system` built on the test Redis still have to
    write (status records, key completions: written from a background thread after the call that
    made them returned) is there, so that a test's clean-up comes after it; then forget them."""
    while _SENDERS:
        for middleware in _SENDERS.pop().middleware:
            writes = getattr(middleware, "writes", None)
            if writes is not None:
                writes.flush(timeout)


def publish_dead_letters(broker: Any, queue: str, count: int) -> str:
    """``count`` dead letters of ``queue``, published and indexed as a worker's consumer does (the
    record names its queue); returns their ``.DLQ``."""
    for i in range(count):
        message: dramatiq.Message[Any] = dramatiq.Message(queue, "record", (f"d{i}",), {}, {})
        headers = {"x-dl-reason": "retries_exhausted", "x-dl-actor": "record", "x-dl-attempts": 1}
        headers["x-dl-queue"] = queue
        broker.publish_dead_letter(message.encode(), headers, message.message_id, queue)
    assert broker.dead_letter_index.flush(10)
    return queue + ".DLQ"
