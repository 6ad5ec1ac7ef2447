"""The deliveries pika has already read off the socket, which the consumer takes as one burst.

pika's ``BlockingChannel.consume`` generator hands out one delivery at a time from a buffer it
fills by reading the socket; under load one read brings many (with Dramatiq's prefetch of twice
the threads, 2 x 8 threads: about 11 on average). The project's consumer takes what is buffered
along with the delivery it waited for, without waiting for more, so that the work it does with
the state store per delivery (the idempotency claims made at receipt) costs one round trip per
burst. pika has no public count of that buffer: :func:`buffered_deliveries` reads it, and
:func:`check_buffer_contract` checks it is still there (run by the unit tests).
"""

from __future__ import annotations

import inspect

from pika.adapters import blocking_connection
from pika.adapters.blocking_connection import BlockingChannel

__all__ = ["buffered_deliveries", "check_buffer_contract"]


def buffered_deliveries(channel: BlockingChannel) -> int:
    """How many deliveries the channel's consumer generator can hand out without reading the
    socket: those buffered ahead of anything else (a cancellation ends the generator)."""
    consumer = getattr(channel, "_queue_consumer_generator", None)
    if consumer is None:
        return 0
    count = 0
    for event in consumer.pending_events:
        if type(event) is not blocking_connection._ConsumerDeliveryEvt:
            break
        count += 1
    return count


def check_buffer_contract() -> list[str]:
    """What of pika's consume generator :func:`buffered_deliveries` relies on is missing (empty:
    all there)."""
    problems = []
    if not isinstance(getattr(blocking_connection, "_ConsumerDeliveryEvt", None), type):
        problems.append("pika.adapters.blocking_connection._ConsumerDeliveryEvt")
    source = inspect.getsource(BlockingChannel.consume)
    if "self._queue_consumer_generator.pending_events" not in source:
        problems.append("BlockingChannel.consume yields from _queue_consumer_generator.pending_events")
    return problems
