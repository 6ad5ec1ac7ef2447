"""Cumulative acks on the real RabbitMQ: the project's consumer acks a run of finished deliveries
with one ``multiple`` ack, RabbitMQ accepts it, and a delivery still running below the others'
tags, or requeued by the consumer's hold path, is not acked with them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from dramatiq import Consumer

from jobsystem.dramatiq_internals import request_redelivery
from jobsystem.rabbitmq.consumer import DeadLetteringConsumer
from tests import workload
from tests.queues import Queues
from tests.support import wait_for


def received(consumer: Consumer, count: int) -> list[Any]:
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


def wait_sent_more(consumer: DeadLetteringConsumer, frames: list[tuple[int, bool]], count: int) -> None:
    """Run pika's poll loop until ``count`` frames in all were queued."""

    def sent() -> bool:
        consumer.connection.process_data_events(time_limit=0.05)
        return len(frames) >= count

    wait_for(sent, what=f"{count} ack frames")


@contextmanager
def acking(
    queues: Queues, count: int, *, left: str
) -> Iterator[tuple[DeadLetteringConsumer, list[Any], list[tuple[int, bool]]]]:
    """A consumer of ``count`` sent messages, the deliveries it received, and the ack frames it
    queues. On a clean exit: RabbitMQ took the acks (one it refused, an unknown tag, would have
    closed the channel), and once the consumer closed, what came back to the queue (every
    delivery not acked) is ``left``'s message alone."""
    queue = queues.name(workload.record)
    for i in range(count):
        queues.send(workload.record, f"ack-{i}")
    consumer = queues.broker.consume(queue, prefetch=count, timeout=100)
    assert isinstance(consumer, DeadLetteringConsumer)
    frames = noting_acks(consumer)
    try:
        yield consumer, received(consumer, count), frames
        consumer.connection.process_data_events(time_limit=0.2)
        assert consumer.channel.is_open
    finally:
        consumer.close()
    wait_for(lambda: queues.depth(queue) == 1, what="the delivery not acked back in the queue")
    (back,) = queues.peek(queue)
    assert json.loads(back["payload"])["args"] == [left]


def test_finished_deliveries_leave_as_one_cumulative_ack_and_a_running_one_stays(queues: Queues):
    with acking(queues, 10, left="ack-4") as (consumer, messages, frames):
        consumer.acks.young_s = 30.0  # the running one was handed out while the test polled
        running = messages[4]
        for message in messages:
            if message is not running:
                consumer.ack(message)
        wait_sent(consumer, frames)
        tags = [message._tag for message in messages]
        assert frames == [(tags[3], True)]  # those above the running one wait for it a while
        wait_sent_more(consumer, frames, len(tags) - 4)
        assert frames == [(tags[3], True)] + [(tag, False) for tag in tags[5:]]


def test_acks_that_waited_for_the_delivery_below_them_leave_with_it_in_one_cumulative_ack(
    queues: Queues,
):
    with acking(queues, 10, left="ack-9") as (consumer, messages, frames):
        consumer.acks.hold_s = consumer.acks.young_s = 30.0  # the wait cannot end before it does
        running, last = messages[4], messages[9]
        for message in messages[:9]:
            if message is not running:
                consumer.ack(message)
        wait_sent(consumer, frames)
        consumer.ack(running)
        wait_sent_more(consumer, frames, 2)
        assert frames == [(messages[3]._tag, True), (messages[8]._tag, True)]
        assert last not in messages[:9]


def test_acks_still_waiting_when_the_consumer_closes_are_sent_first(queues: Queues):
    """Without the release at close, RabbitMQ would redeliver the five acked after the running one."""
    with acking(queues, 10, left="ack-4") as (consumer, messages, frames):
        consumer.acks.hold_s = consumer.acks.young_s = 30.0
        for message in messages:
            if message is not messages[4]:
                consumer.ack(message)
        wait_sent(consumer, frames)
        assert frames == [(messages[3]._tag, True)]


def test_a_delivery_requeued_by_the_hold_path_is_not_covered_by_the_cumulative_ack(queues: Queues):
    with acking(queues, 6, left="ack-1") as (consumer, messages, frames):
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


def test_an_ack_from_before_a_reconnect_does_not_settle_the_new_channels_delivery(queues: Queues):
    """A consumer restarted after a lost connection numbers its deliveries from 1 again, and
    Dramatiq settles a job that ran across the restart through the new consumer: its tag names
    one of the new channel's deliveries, which an ack would lose."""
    queue = queues.name(workload.record)
    for i in range(3):
        queues.send(workload.record, f"tag-{i}")
    before = queues.broker.consume(queue, prefetch=3, timeout=100)
    stale = received(before, 3)
    before.close()  # the connection lost: RabbitMQ requeues the three
    after = queues.broker.consume(queue, prefetch=3, timeout=100)
    assert isinstance(after, DeadLetteringConsumer)
    try:
        fresh = received(after, 3)
        assert {m._tag for m in fresh} == {m._tag for m in stale}  # the same numbers
        frames = noting_acks(after)
        for message in stale:
            after.ack(message)
        first = min(fresh, key=lambda m: m._tag)
        after.ack(first)
        wait_sent(after, frames)
        assert frames[0][0] == first._tag and len(frames) == 1  # the stale acks sent nothing
    finally:
        after.close()
    wait_for(lambda: queues.depth(queue) == 2, what="the two deliveries not acked back in the queue")
