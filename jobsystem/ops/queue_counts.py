"""Queue counts over AMQP for health: passive declares, exact and current, on one connection.

Per work queue: messages waiting and consumers of the queue, of its delay queue ``<queue>.DQ``
(Dramatiq's worker consumes it apart, holding each delayed message until its ``eta``) and of its
dead letters; and this environment's ``delay.unroutable`` queue, which nothing consumes. One
connection serves them all, each node tried once within the health check's deadline (pika's own
handshake timeout, 15 s, would otherwise outlast any scrape), and is cut at the deadline whatever
it waits for then: past the handshake, pika waits for an answer (channel open, a declare, the
close) with no timeout but the heartbeat's (65 s, none with ``RABBITMQ_HEARTBEAT=0``).
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
from jobsystem.runtime.connecting import open_connection
from jobsystem.settings import Settings
from jobsystem.urls import redact_url

__all__ = ["AmqpCounts", "QueueCounts", "count_queues", "dead_letter_counts", "missing_queues"]


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


def _connect(config: Settings, timeout: float, deadline: Deadline) -> pika.BlockingConnection:
    """An AMQP connection to the first node that answers (one attempt each, ``timeout`` seconds
    for the whole handshake, and no node tried past ``deadline``)."""
    errors: list[str] = []
    for url in connection_urls(config):
        wait = deadline.within(timeout)
        if wait <= 0:
            errors.append("no time left")
            break
        parameters = pika.URLParameters(url)
        parameters.socket_timeout = wait
        parameters.stack_timeout = wait
        parameters.blocked_connection_timeout = wait
        parameters.connection_attempts = 1
        try:
            return open_connection(parameters)
        except pika.exceptions.AMQPError as exc:  # a handshake timeout too: HandshakeTimeout
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


def _cut_at(connection: pika.BlockingConnection, deadline: Deadline) -> None:
    """Drop ``connection``'s socket when ``deadline`` passes, whatever it waits for then (its
    close included): a blocking call raises at once. pika runs its I/O loop's timers while a
    blocking call waits (not the BlockingConnection's own, run only by ``process_data_events``);
    ``_terminate_stream`` is what its heartbeat timeout uses, without a public name. A cut that
    finds the socket already gone (a close answered in the same turn of pika's loop) does nothing:
    terminating it again would fail on the missing transport."""
    impl = connection._impl
    error = pika.exceptions.StreamLostError(f"no answer within {deadline.seconds:g} s")

    def cut() -> None:
        if not impl.is_closed and getattr(impl, "_transport", None) is not None:
            impl._terminate_stream(error)

    impl.ioloop.call_later(deadline.remaining(), cut)


@contextlib.contextmanager
def _declares(config: Settings, timeout: float, deadline: Deadline) -> Iterator[_Passive]:
    """Passive declares on a connection of their own, cut at ``deadline`` and closed after; a
    lost connection is a ConnectionError, like an unreachable RabbitMQ."""
    connection = _connect(config, timeout, deadline)
    _cut_at(connection, deadline)
    try:
        yield _Passive(connection)
    except pika.exceptions.AMQPError as exc:
        raise ConnectionError(f"connection lost: {type(exc).__name__}") from exc
    finally:
        if connection.is_open:
            with contextlib.suppress(pika.exceptions.AMQPError):  # cut while closing: the counts stand
                connection.close()


def count_queues(config: Settings, queues: list[str], timeout: float, deadline: Deadline) -> AmqpCounts:
    """The counts of ``queues`` and of ``delay.unroutable``; ConnectionError when RabbitMQ cannot
    be reached or the connection is lost."""
    unroutable = DelayCascade(config.queue_prefix).unroutable
    with _declares(config, timeout, deadline) as passive:
        counted = {queue: passive.queue(queue) for queue in queues}
        return AmqpCounts(counted, unroutable, passive.counts(unroutable)[0])


def missing_queues(
    config: Settings, queues: list[str], timeout: float = 5.0, deadline: Deadline | None = None
) -> list[str]:
    """Those of ``queues`` RabbitMQ does not have (a typo in ``--queue``), within ``timeout``
    seconds (or by ``deadline``, one its caller shares); ConnectionError when RabbitMQ cannot be
    reached or does not answer in that time."""
    with _declares(config, timeout, deadline or Deadline(timeout)) as passive:
        return [queue for queue in queues if passive.declare(queue) is None]


def dead_letter_counts(config: Settings, queues: list[str], timeout: float) -> dict[str, int | None]:
    """The dead letters waiting in each of ``queues``' dead-letter queue (None: RabbitMQ has no
    such queue), within ``timeout`` seconds in all; ConnectionError as :func:`count_queues`."""
    with _declares(config, timeout, Deadline(timeout)) as passive:
        found = {queue: passive.declare(dead_letter_queue(queue)) for queue in queues}
    return {queue: None if counts is None else counts[0] for queue, counts in found.items()}
