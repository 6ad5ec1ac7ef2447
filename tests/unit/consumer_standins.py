"""Stand-ins for the project's consumer's connection and channel, as its own thread runs them: what
the consumer decides when it settles a delivery (the frames it queues, the hand-offs refused once
the connection is lost), without RabbitMQ."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pika.exceptions

from jobsystem.rabbitmq.acks import AckBatch
from jobsystem.rabbitmq.consumer import DeadLetteringConsumer
from tests.unit.stub import delivery

__all__ = ["Connection", "Frames", "consumer_of", "delivered"]


class Frames:
    """A channel's ``_impl``: notes each ack frame, and what ``on_ack`` saw when it was queued."""

    def __init__(self, on_ack: Callable[[], Any]) -> None:
        self._impl = self
        self.on_ack = on_ack
        self.acked: list[tuple[int, Any]] = []
        self.sent = threading.Event()

    def basic_ack(self, delivery_tag: int, multiple: bool = False) -> None:
        self.acked.append((delivery_tag, self.on_ack()))
        self.sent.set()

    def basic_nack(self, delivery_tag: int, requeue: bool = False) -> None:
        self.acked.append((-delivery_tag, self.on_ack()))
        self.sent.set()


class Connection:
    """The consumer's connection as its own thread runs it: callbacks at once (in order, one at a
    time), timers on a timer thread. ``lost``: every hand-off refused, as pika refuses it once the
    connection closed."""

    def __init__(self, *, lost: bool = False) -> None:
        self.lost = lost
        self._lock = threading.RLock()

    def add_callback_threadsafe(self, callback: Callable[[], None]) -> None:
        if self.lost:
            raise pika.exceptions.ConnectionWrongStateError("connection closed")
        with self._lock:
            callback()

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        timer = threading.Timer(delay, self.add_callback_threadsafe, (callback,))
        timer.daemon = True
        timer.start()


def consumer_of(broker: Any, connection: Connection, channel: Frames) -> Any:
    """The project's consumer on stand-ins for its connection and channel: its settling decisions."""
    consumer: Any = object.__new__(DeadLetteringConsumer)
    consumer.broker, consumer.queue_name = broker, "q"
    consumer.connection, consumer.channel = connection, channel
    consumer.known_tags = set()
    consumer.acks = AckBatch(connection, channel)
    return consumer


def delivered(consumer: Any, message: Any) -> Any:
    """``message`` as ``consumer`` hands it to a worker thread."""
    proxy = delivery(message)
    proxy.delivered_on = consumer
    consumer.known_tags.add(proxy.tag)
    consumer.acks.delivered(proxy.tag)
    return proxy
