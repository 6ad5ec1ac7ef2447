"""Acks gathered per wake-up of the connection's thread: one hand-off and one socket write for all
the acks the worker threads produced meanwhile, not one of each per message.

Dramatiq's consumer acks a message by handing ``channel.basic_ack(tag)`` to the connection's
thread (``add_callback_threadsafe``): a write to the connection's wake-up pipe, a timer event, a
poll and a socket write for every single message, which made the ack path the costliest part of
a worker at a few thousand jobs a second. Here the first ack of a batch schedules one callback;
acks arriving before it runs join the batch; the callback queues every frame of the batch, and
pika's poll loop, where the consumer's thread waits for deliveries, writes them.

Nothing changes what is acknowledged: each delivery is still acked on its own (never with
``multiple``, since a lower tag may still be running), on the connection's own thread, in the
order the worker threads finished. A batch lost with its connection is like Dramatiq's lost
callbacks: the deliveries were not acked, so RabbitMQ redelivers them.

It uses a private name of pika's ``BlockingChannel``: ``_impl``, the asynchronous channel whose
``basic_ack`` queues a frame (``BlockingChannel.basic_ack`` calls it, then waits until the frame
is written). ``check_pika_contract`` checks it is still there.
"""

from __future__ import annotations

import inspect
import threading
from typing import Any

import pika.exceptions
from dramatiq.errors import ConnectionClosed
from pika.adapters.blocking_connection import BlockingChannel

__all__ = ["AckBatch", "check_pika_contract"]


class AckBatch:
    """The acks waiting for the connection's thread of one consumer.

    Parameters:
      connection: the consumer's ``pika.BlockingConnection``.
      channel: the consumer's ``BlockingChannel`` (acks must go on the channel that delivered).
    """

    def __init__(self, connection: Any, channel: BlockingChannel) -> None:
        self.connection = connection
        self.channel = channel
        self._lock = threading.Lock()
        self._tags: list[int] = []

    def add(self, tag: int) -> None:
        """Ack delivery ``tag`` on the connection's thread, with the others of its batch.

        Raises ``ConnectionClosed`` (as Dramatiq's ``ack`` does) when the connection cannot take
        the callback; the batch is then dropped (RabbitMQ redelivers its deliveries)."""
        with self._lock:
            self._tags.append(tag)
            first = len(self._tags) == 1
        if not first:
            return  # the callback scheduled for the batch has not run yet: it sends this one too
        try:
            self.connection.add_callback_threadsafe(self._send)
        except (pika.exceptions.AMQPConnectionError, pika.exceptions.AMQPChannelError) as exc:
            with self._lock:
                self._tags.clear()
            raise ConnectionClosed(exc) from None  # type: ignore[no-untyped-call]

    def _send(self) -> None:
        """On the connection's thread: queue an ack frame per tag for the connection to write.

        No flush of its own: the consumer's thread is always in, or on its way back to, pika's
        poll loop (``consume`` waits there for the next delivery), which writes queued frames as
        soon as the socket takes them, in order, before any later frame such as a channel close."""
        with self._lock:
            tags, self._tags = self._tags, []
        channel = self.channel._impl
        for tag in tags:
            channel.basic_ack(delivery_tag=tag, multiple=False)


def check_pika_contract() -> list[str]:
    """What of pika's ``BlockingChannel`` :class:`AckBatch` relies on is missing (empty: all there)."""
    problems = []
    if "self._impl.basic_ack(" not in inspect.getsource(BlockingChannel.basic_ack):
        problems.append("BlockingChannel.basic_ack calls self._impl.basic_ack")
    return problems
