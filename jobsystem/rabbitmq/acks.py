"""Acks gathered per wake-up of the connection's thread, and sent as one cumulative ack where
they allow it.

Dramatiq's consumer acks a message by handing ``channel.basic_ack(tag)`` to the connection's
thread (``add_callback_threadsafe``): a write to the connection's wake-up pipe, a timer event, a
poll and a socket write for every single message. Here the first ack of a batch schedules one
callback; acks arriving before it runs join the batch; the callback queues the batch's frames,
and pika's poll loop, where the consumer's thread waits for deliveries, writes them.

**Cumulative acks.** RabbitMQ handles an ack frame per message at a high price: measured with a
bare pika consumer, about 33 us of the server's CPU per message on a plain queue (44 -> 11 us
per message when one ``multiple`` ack covers eight deliveries) and 26 us on a priority queue.
So a batch is sent as one ``basic_ack(tag, multiple=True)`` for its part that forms a prefix of
the channel's open deliveries, and single acks for the rest. ``multiple`` acknowledges every
unacknowledged delivery up to ``tag``, so it is only safe when each of them is meant to be acked
now. The batch keeps a ledger of the channel's deliveries whose settlement frame has not been
queued yet (:meth:`AckBatch.delivered`, :meth:`AckBatch.settled`); the cumulative ack covers only
tags of the batch below the lowest delivery still open outside it: one still running, held for a
later requeue, or waiting for its dead letter's confirm. RabbitMQ handles a channel's frames in
order, so a delivery settled earlier by another frame is no longer pending when the cumulative
ack arrives. A delivery the ledger does not know is acked on its own. A ledger that forgets a
settlement only makes later batches fall back to single acks; no ack is ever held back.

The ledger is read and written only on the connection's thread (deliveries come out of pika's
consume loop there, and every settlement frame is queued there), so it needs no lock. A delay
queue's consumer holds thousands of deliveries until they are due, so the lowest open delivery
is found from the front of the tags in delivery order (which is increasing order), with settled
ones dropped as they reach the front: amortised constant time per ack, not a scan of the ledger.

It uses a private name of pika's ``BlockingChannel``: ``_impl``, the asynchronous channel whose
``basic_ack`` queues a frame (``BlockingChannel.basic_ack`` calls it, then waits until the frame
is written). ``check_pika_contract`` checks it is still there.
"""

from __future__ import annotations

import inspect
import threading
from collections import deque
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
        #: Delivery tags handed out and not settled yet (connection's thread only).
        self._open: set[int] = set()
        #: The same tags in delivery order, and settled ones not yet dropped from it.
        self._order: deque[int] = deque()

    def delivered(self, tag: int) -> None:
        """Note delivery ``tag`` as handed out; on the connection's thread."""
        self._open.add(tag)
        self._order.append(tag)
        if len(self._order) > 4 * len(self._open) + 1024:  # settled tags kept behind an old one
            self._order = deque(t for t in self._order if t in self._open)

    def settled(self, tag: int) -> None:
        """Note that delivery ``tag``'s settlement frame (an ack or nack sent other than through
        this batch) is being queued; on the connection's thread, just before the frame."""
        self._open.discard(tag)

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
        """On the connection's thread: queue the batch's ack frames for the connection to write.

        No flush of its own: the consumer's thread is always in, or on its way back to, pika's
        poll loop (``consume`` waits there for the next delivery), which writes queued frames as
        soon as the socket takes them, in order, before any later frame such as a channel close."""
        with self._lock:
            tags, self._tags = self._tags, []
        channel = self.channel._impl
        covered = self._prefix(tags)
        if covered:
            channel.basic_ack(delivery_tag=max(covered), multiple=True)
        for tag in tags:
            if tag not in covered:
                channel.basic_ack(delivery_tag=tag, multiple=False)
        self._open.difference_update(tags)

    def _prefix(self, tags: list[int]) -> set[int]:
        """The tags one cumulative ack may cover: known deliveries of the batch below every
        delivery still open outside it (empty when fewer than two qualify)."""
        batch = set(tags)
        known = batch & self._open
        if len(known) < 2:
            return set()
        first_open = self._first_open_outside(batch)
        covered = known if first_open is None else {tag for tag in known if tag < first_open}
        return covered if len(covered) > 1 else set()

    def _first_open_outside(self, batch: set[int]) -> int | None:
        """The lowest delivery still open that is not in ``batch`` (None: there is none)."""
        order, still_open = self._order, self._open
        while order and order[0] not in still_open:
            order.popleft()
        for tag in order:
            if tag in still_open and tag not in batch:
                return tag
        return None


def check_pika_contract() -> list[str]:
    """What of pika's ``BlockingChannel`` :class:`AckBatch` relies on is missing (empty: all there)."""
    problems = []
    if "self._impl.basic_ack(" not in inspect.getsource(BlockingChannel.basic_ack):
        problems.append("BlockingChannel.basic_ack calls self._impl.basic_ack")
    return problems
