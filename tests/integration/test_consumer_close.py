"""A consumer whose channel RabbitMQ closed still closes its connection.

Dramatiq's consumer closes its channel, then its connection. After RabbitMQ closed the channel (a
queue deleted under it, a delivery held past ``consumer_timeout``: PRECONDITION_FAILED), closing
the channel raised and the connection was never closed: the consumer thread restarts its consumer
every few seconds on such an error, and each restart left one more connection open (review 6).
"""

from __future__ import annotations

import contextlib

import pika.exceptions
import pytest
from dramatiq.errors import ConnectionClosed

from jobsystem.rabbitmq.consumer import DeadLetteringConsumer
from tests import workload
from tests.queues import Queues


def test_a_consumer_whose_channel_rabbitmq_closed_closes_its_connection(queues: Queues) -> None:
    queue = queues.name(workload.record)
    queues.broker.declare_queue(queue, ensure=True)
    consumer = queues.broker.consume(queue, prefetch=1, timeout=100)
    assert isinstance(consumer, DeadLetteringConsumer)
    connection = consumer.connection
    try:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker):  # RabbitMQ closes the channel
            consumer.channel.queue_declare(queue=f"{queues.prefix}missing", passive=True)
        with contextlib.suppress(ConnectionClosed):  # what Dramatiq's consumer thread expects
            consumer.close()
        assert connection.is_closed
    finally:
        if connection.is_open:
            connection.close()
