"""A test double for ``jobctl migrate-queues``: imported as an application module, it makes someone
else act on RabbitMQ at the worst moment of the migration, on a connection of its own.

``MIGRATION_INTERFERENCE`` names the queue and what happens to it:

- ``redeclare:<queue>``: once the migration deleted the drained ``<queue>``, it is declared again
  with plain Dramatiq's arguments (a worker of the old configuration starting), before the
  migration declares it with the project's.
- ``delete:<queue>``: once the first message of ``<queue>`` moved out, ``<queue>`` is deleted (by
  hand, another run), before the migration asks for the next.
- ``delete-declared:<queue>``: once the migration declared ``<queue>`` (the twin ``<name>.migrating``,
  or ``<name>`` recreated), it is deleted, before the migration publishes the first message to it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pika

from jobsystem.ops import migration
from jobsystem.system import get_system

_what, _, _queue = os.environ.get("MIGRATION_INTERFERENCE", "").partition(":")


def _elsewhere(act: Callable[[Any], object]) -> None:
    """``act(channel)`` on a connection other than the migration's."""
    url = get_system().settings.rabbitmq_url.split(";")[0]
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        act(connection.channel())
    finally:
        connection.close()


_delete_empty = migration._delete_empty
_move = migration._move
_declare = migration._declare


def _delete_then_redeclare(channel: Any, name: str, moved_to: str) -> None:
    _delete_empty(channel, name, moved_to)
    if name == _queue:
        _elsewhere(lambda other: other.queue_declare(name, durable=True))


def _move_then_delete(channel: Any, source: str, publish: Callable[[Any, bytes], None]) -> int:
    def publish_then_delete(properties: Any, body: bytes) -> None:
        publish(properties, body)
        _elsewhere(lambda other: other.queue_delete(source))

    return _move(channel, source, publish_then_delete if source == _queue else publish)


def _declare_then_delete(channel: Any, name: str, wanted: dict[str, Any], other: str) -> None:
    _declare(channel, name, wanted, other)
    if name == _queue:
        _elsewhere(lambda other_channel: other_channel.queue_delete(name))


if _what == "redeclare":
    migration._delete_empty = _delete_then_redeclare
elif _what == "delete":
    migration._move = _move_then_delete
elif _what == "delete-declared":
    migration._declare = _declare_then_delete
