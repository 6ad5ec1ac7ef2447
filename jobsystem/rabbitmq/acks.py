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
settlement only makes later batches fall back to single acks.

**Waiting for the delivery below.** Worker threads finish out of order when their jobs wait on
something (a claim, a token from the state store): a batch's acks then often sit above one
delivery still running, and would go one frame each. They may wait for it, up to ``hold_s``,
and leave with it in one cumulative ack; when the wait ends first, they go one by one. They
wait only behind a delivery handed out less than ``young_s`` ago: behind a long job or a
delayed message they go at once, so waiting acks hold few prefetch slots, briefly. The
consumer releases the waiting acks before its channel closes (:meth:`AckBatch.release_held`),
so a stop redelivers none of them; a crash redelivers them, as it would any ack not yet sent.

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
import time
from collections import deque
from collections.abc import Callable
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
      hold_s: how long acks above an open delivery may wait for it to settle, so that one
        cumulative ack covers them all (0: never; they go one by one at once).
      young_s: acks wait only behind a delivery handed out less than this long ago (one that is
        likely to finish soon); behind an older one, a long job or a delayed message, they go
        at once, so they never hold prefetch slots for long.
      clock: monotonic seconds.
    """

    def __init__(
        self,
        connection: Any,
        channel: BlockingChannel,
        *,
        hold_s: float = 0.0,
        young_s: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.connection = connection
        self.channel = channel
        self.hold_s = hold_s
        self.young_s = young_s
        self.clock = clock
        self._lock = threading.Lock()
        self._tags: list[int] = []
        #: Delivery tags handed out and not settled yet, with when (connection's thread only).
        self._open: dict[int, float] = {}
        #: The same tags in delivery order, and settled ones not yet dropped from it.
        self._order: deque[int] = deque()
        #: Acks waiting for the delivery below them, and whether their release is scheduled
        #: (connection's thread only).
        self._held: list[int] = []
        self._release_scheduled = False

    def delivered(self, tag: int) -> None:
        """Note delivery ``tag`` as handed out; on the connection's thread."""
        self._open[tag] = self.clock()
        self._order.append(tag)
        if len(self._order) > 4 * len(self._open) + 1024:  # settled tags kept behind an old one
            self._order = deque(t for t in self._order if t in self._open)

    def settled(self, tag: int) -> None:
        """Note that delivery ``tag``'s settlement frame (an ack or nack sent other than through
        this batch) is being queued; on the connection's thread, just before the frame."""
        self._open.pop(tag, None)

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

    def release_held(self) -> None:
        """On the connection's thread: queue the frames of the acks held back, at once (the
        consumer calls it before its channel closes)."""
        self._release_scheduled = False
        self._queue_frames([], hold=False)

    def _send(self) -> None:
        """On the connection's thread: queue the batch's ack frames for the connection to write.

        No flush of its own: the consumer's thread is always in, or on its way back to, pika's
        poll loop (``consume`` waits there for the next delivery), which writes queued frames as
        soon as the socket takes them, in order, before any later frame such as a channel close."""
        with self._lock:
            tags, self._tags = self._tags, []
        self._queue_frames(tags, hold=self.hold_s > 0)

    def _queue_frames(self, tags: list[int], *, hold: bool) -> None:
        """Queue the frames of ``tags`` and of the acks held so far: one cumulative ack for the
        known ones below every delivery still open outside them; those above one are held
        (``hold``, behind a young delivery, release scheduled) or acked one by one, as are
        tags the ledger does not know."""
        if self._held:
            tags, self._held = self._held + tags, []
        known = [tag for tag in tags if tag in self._open]
        blocker = self._first_open_outside(set(tags)) if known else None
        below = [tag for tag in known if blocker is None or tag < blocker]
        above = [tag for tag in known if blocker is not None and tag > blocker]
        channel = self.channel._impl
        cumulative = set(below) if len(below) > 1 else set()
        if cumulative:
            channel.basic_ack(delivery_tag=max(cumulative), multiple=True)
        if hold and above and blocker is not None and self._may_wait_for(blocker):
            self._held = above
        held = set(self._held)
        for tag in tags:
            if tag not in held:
                if tag not in cumulative:
                    channel.basic_ack(delivery_tag=tag, multiple=False)
                self._open.pop(tag, None)

    def _may_wait_for(self, blocker: int) -> bool:
        """Whether acks may be held behind ``blocker``: it was handed out recently and their
        release is (or can be) scheduled within ``hold_s``."""
        if self.clock() - self._open[blocker] >= self.young_s:
            return False
        if not self._release_scheduled:
            try:
                self.connection.call_later(self.hold_s, self.release_held)
            except Exception:  # a closing connection: ack them now
                return False
            self._release_scheduled = True
        return True

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
