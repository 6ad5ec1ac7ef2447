"""Cumulative acks on the real RabbitMQ: the project's consumer acks a run of finished deliveries
with one ``multiple`` ack, RabbitMQ accepts it, and a delivery still running below the others'
tags, or requeued by the consumer's hold path, is not acked with them."""

from __future__ import annotations

import json
from typing import Any

from jobsystem.dramatiq_internals import request_redelivery
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


def noting_acks(consumer: DeadLetteringConsumer) -> list[tuple[int, bool]]:
    """The ack frames the consumer queues from now on, as (delivery tag, multiple)."""
    frames: list[tuple[int, bool]] = []
    impl = consumer.channel._impl
    send_ack = impl.basic_ack

    def noted_ack(delivery_tag: int, multiple: bool = False) -> None:
        frames.append((delivery_tag, multiple))
        send_ack(delivery_tag=delivery_tag, multiple=multiple)

    impl.basic_ack = noted_ack
    return frames


def wait_sent(consumer: DeadLetteringConsumer, frames: list[tuple[int, bool]]) -> None:
    """Run pika's poll loop, as the consumer's thread does, until the batch's callback sent frames."""

    def sent() -> bool:
        consumer.connection.process_data_events(time_limit=0.05)
        return bool(frames)

    wait_for(sent, what="the acks")


def consumer_of(queues: Queues, queue: str, count: int) -> DeadLetteringConsumer:
    for i in range(count):
        queues.send(workload.record, f"ack-{i}")
    consumer = queues.broker.consume(queue, prefetch=count, timeout=100)
    assert isinstance(consumer, DeadLetteringConsumer)
    return consumer


def assert_accepted(consumer: DeadLetteringConsumer) -> None:
    """RabbitMQ took the acks: one it refused (an unknown tag) would have closed the channel."""
    consumer.connection.process_data_events(time_limit=0.2)
    assert consumer.channel.is_open


def assert_only_left(queues: Queues, queue: str, token: str) -> None:
    """After the consumer closed, what came back to the queue (every delivery not acked) is
    ``token``'s message alone."""
    wait_for(lambda: queues.depth(queue) == 1, what="the delivery not acked back in the queue")
    (left,) = queues.peek(queue)
    assert json.loads(left["payload"])["args"] == [token]


def test_finished_deliveries_leave_as_one_cumulative_ack_and_a_running_one_stays(queues: Queues):
    queue = queues.name(workload.record)
    consumer = consumer_of(queues, queue, 10)
    frames = noting_acks(consumer)
    try:
        messages = received(consumer, 10)
        running = messages[4]
        for message in messages:
            if message is not running:
                consumer.ack(message)
        wait_sent(consumer, frames)
        tags = [message._tag for message in messages]
        assert frames == [(tags[3], True)] + [(tag, False) for tag in tags[5:]]
        assert_accepted(consumer)
    finally:
        consumer.close()
    assert_only_left(queues, queue, "ack-4")


def test_a_delivery_requeued_by_the_hold_path_is_not_covered_by_the_cumulative_ack(queues: Queues):
    queue = queues.name(workload.record)
    consumer = consumer_of(queues, queue, 6)
    frames = noting_acks(consumer)
    try:
        messages = received(consumer, 6)
        held = messages[1]
        request_redelivery(held)  # its follow-up could not be published: requeued after a hold
        consumer.ack(held)
        (again,) = received(consumer, 1)  # the requeue's nack went, and RabbitMQ redelivered it
        assert again.message_id == held.message_id and again._tag > messages[-1]._tag
        for message in messages:
            if message is not held:
                consumer.ack(message)
        wait_sent(consumer, frames)
        assert frames == [(messages[-1]._tag, True)]  # covers the five, below the redelivered copy
        assert_accepted(consumer)
    finally:
        consumer.close()
    assert_only_left(queues, queue, "ack-1")
