"""Queue counts over AMQP for health: passive declares, exact and current, on one connection.

Per work queue: messages waiting and consumers of the queue, of its delay queue ``<queue>.DQ``
(Dramatiq's worker consumes it apart, holding each delayed message until its ``eta``) and of its
dead letters; and this environment's ``delay.unroutable`` queue, which nothing consumes. One
connection serves them all, each node tried once within the health check's deadline (pika's own
handshake timeout, 15 s, would otherwise outlast any scrape).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import pika
import pika.exceptions

from jobsystem.ops.deadline import Deadline
from jobsystem.rabbitmq.broker import connection_urls, dead_letter_queue
from jobsystem.rabbitmq.delays import DelayCascade
from jobsystem.settings import Settings, redact_url

__all__ = ["AmqpCounts", "QueueCounts", "count_queues", "missing_queues"]


@dataclass(frozen=True)
class QueueCounts:
    """One work queue's messages and consumers, its delay queue's, and its dead letters."""

    waiting: int
    consumers: int
    delayed: int
    delay_consumers: int
    dead: int


@dataclass(frozen=True)
class AmqpCounts:
    """The counts of each queue asked for, and of ``unroutable`` (this environment's
    ``delay.unroutable``: delayed jobs whose delay queue was gone when they left the cascade)."""

    queues: dict[str, QueueCounts]
    unroutable: str
    stranded: int


def _connect(config: Settings, timeout: float, deadline: Deadline | None = None) -> pika.BlockingConnection:
    """An AMQP connection to the first node that answers (one attempt each, ``timeout`` seconds
    for the whole handshake, and no node tried past ``deadline``)."""
    errors: list[str] = []
    for url in connection_urls(config):
        wait = timeout if deadline is None else deadline.within(timeout)
        if wait <= 0:
            errors.append("no time left")
            break
        parameters = pika.URLParameters(url)
        parameters.socket_timeout = wait
        parameters.stack_timeout = wait
        parameters.blocked_connection_timeout = wait
        parameters.connection_attempts = 1
        try:
            return pika.BlockingConnection(parameters)
        except pika.exceptions.AMQPError as exc:
            errors.append(f"{redact_url(url.split('?')[0])} {type(exc).__name__}")
    raise ConnectionError(", ".join(errors) or "no RabbitMQ node")


class _Passive:
    """Passive declares on one channel (RabbitMQ closes a channel on a missing queue: reopen it)."""

    def __init__(self, connection: pika.BlockingConnection) -> None:
        self.connection = connection
        self.channel = connection.channel()

    def declare(self, name: str) -> tuple[int, int] | None:
        """(ready messages, consumers) of ``name``, exact and current; None for a missing queue."""
        try:
            ok = self.channel.queue_declare(name, passive=True).method
            return int(ok.message_count), int(ok.consumer_count)
        except pika.exceptions.ChannelClosedByBroker:
            self.channel = self.connection.channel()
            return None

    def counts(self, name: str) -> tuple[int, int]:
        """(ready messages, consumers) of ``name``; (0, 0) for a missing queue."""
        return self.declare(name) or (0, 0)

    def queue(self, name: str) -> QueueCounts:
        waiting, consumers = self.counts(name)
        delayed, delay_consumers = self.counts(name + ".DQ")
        return QueueCounts(
            waiting, consumers, delayed, delay_consumers, self.counts(dead_letter_queue(name))[0]
        )


@contextlib.contextmanager
def _declares(config: Settings, timeout: float, deadline: Deadline | None) -> Iterator[_Passive]:
    """Passive declares on a connection of their own, closed after; a lost connection is a
    ConnectionError, like an unreachable RabbitMQ."""
    connection = _connect(config, timeout, deadline)
    try:
        yield _Passive(connection)
    except pika.exceptions.AMQPError as exc:
        raise ConnectionError(f"connection lost: {type(exc).__name__}") from exc
    finally:
        if connection.is_open:
            connection.close()


def count_queues(config: Settings, queues: list[str], timeout: float, deadline: Deadline) -> AmqpCounts:
    """The counts of ``queues`` and of ``delay.unroutable``; ConnectionError when RabbitMQ cannot
    be reached or the connection is lost."""
    unroutable = DelayCascade(config.queue_prefix).unroutable
    with _declares(config, timeout, deadline) as passive:
        counted = {queue: passive.queue(queue) for queue in queues}
        return AmqpCounts(counted, unroutable, passive.counts(unroutable)[0])


def missing_queues(config: Settings, queues: list[str], timeout: float = 5.0) -> list[str]:
    """Those of ``queues`` RabbitMQ does not have (a typo in ``--queue``); ConnectionError when
    RabbitMQ cannot be reached."""
    with _declares(config, timeout, None) as passive:
        return [queue for queue in queues if passive.declare(queue) is None]
