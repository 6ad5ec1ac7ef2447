"""Cumulative acks on the real RabbitMQ: the project's consumer acks a run of finished deliveries
with one ``multiple`` ack, RabbitMQ accepts it, and a delivery still running below the others'
tags is not acked with them (it comes back when the consumer goes)."""

from __future__ import annotations

import json
from typing import Any

from jobsystem.rabbitmq.consumer import DeadLetteringConsumer
from tests import workload
from tests.support import Queues, wait_for


def received(consumer: DeadLetteringConsumer, count: int) -> list[Any]:
    messages: list[Any] = []

    def more() -> bool:
        message = next(consumer)
        if message is not None:
            messages.append(message)
        return len(messages) == count

    wait_for(more, what=f"{count} deliveries")
    return messages


def test_finished_deliveries_leave_as_one_cumulative_ack_and_a_running_one_stays(queues: Queues):
    queue = queues.name(workload.record)
    for i in range(10):
        queues.send(workload.record, f"ack-{i}")
    consumer = queues.broker.consume(queue, prefetch=10, timeout=100)
    assert isinstance(consumer, DeadLetteringConsumer)
    frames: list[tuple[int, bool]] = []
    impl = consumer.channel._impl
    send_ack = impl.basic_ack

    def noted_ack(delivery_tag: int, multiple: bool = False) -> None:
        frames.append((delivery_tag, multiple))
        send_ack(delivery_tag=delivery_tag, multiple=multiple)

    impl.basic_ack = noted_ack
    try:
        messages = received(consumer, 10)
        running = messages[4]
        for message in messages:
            if message is not running:
                consumer.ack(message)

        def sent() -> bool:  # the consumer's thread, in pika's poll loop, runs the batch's callback
            consumer.connection.process_data_events(time_limit=0.05)
            return bool(frames)

        wait_for(sent, what="the acks")
        tags = [message._tag for message in messages]
        assert frames == [(tags[3], True)] + [(tag, False) for tag in tags[5:]]
        consumer.connection.process_data_events(time_limit=0.2)  # a refused ack would close the channel
        assert consumer.channel.is_open
    finally:
        consumer.close()
    # Closing returns what was not acked to the queue: only the running delivery.
    wait_for(lambda: queues.depth(queue) == 1, what="the running delivery back in the queue")
    (left,) = queues.peek(queue)
    assert json.loads(left["payload"])["args"] == ["ack-4"]
