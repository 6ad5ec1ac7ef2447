"""Cumulative acks (``jobsystem.rabbitmq.acks``): one ``multiple`` ack covers a batch's prefix of
the channel's open deliveries and never a delivery meant to be settled otherwise or still running.

The channel here settles frames as RabbitMQ does: a ``multiple`` ack settles every pending
delivery up to its tag, and a frame for a tag that is not pending closes the channel (406).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobsystem.rabbitmq.acks import AckBatch


class UnknownDeliveryTag(Exception):
    """What RabbitMQ answers (406 PRECONDITION_FAILED) to a frame for a tag not pending."""


class RabbitChannel:
    """A channel's pending deliveries, settled frame by frame as RabbitMQ settles them."""

    def __init__(self) -> None:
        self.pending: set[int] = set()
        self.outcome: dict[int, str] = {}
        self.frames: list[tuple[str, int, bool]] = []
        self._impl = self

    def deliver(self, tag: int) -> None:
        self.pending.add(tag)

    def _settle(self, tag: int, how: str) -> None:
        if tag not in self.pending:
            raise UnknownDeliveryTag(tag)
        self.pending.discard(tag)
        self.outcome[tag] = how

    def basic_ack(self, delivery_tag: int, multiple: bool = False) -> None:
        self.frames.append(("ack", delivery_tag, multiple))
        if multiple:
            if delivery_tag not in self.pending:
                raise UnknownDeliveryTag(delivery_tag)
            for tag in sorted(t for t in self.pending if t <= delivery_tag):
                self._settle(tag, "ack")
        else:
            self._settle(delivery_tag, "ack")

    def basic_nack(self, delivery_tag: int, requeue: bool) -> None:
        self.frames.append(("nack", delivery_tag, False))
        self._settle(delivery_tag, "requeue")


class Connection:
    """Runs callbacks when told to, as the connection's thread does at its next poll."""

    def __init__(self) -> None:
        self.callbacks: list[Callable[[], None]] = []

    def add_callback_threadsafe(self, callback: Callable[[], None]) -> None:
        self.callbacks.append(callback)

    def run(self) -> None:
        callbacks, self.callbacks = self.callbacks, []
        for callback in callbacks:
            callback()


def consumer(deliveries: int) -> tuple[Connection, RabbitChannel, AckBatch]:
    connection, channel = Connection(), RabbitChannel()
    acks = AckBatch(connection, channel)  # type: ignore[arg-type]
    for tag in range(1, deliveries + 1):
        channel.deliver(tag)
        acks.delivered(tag)
    return connection, channel, acks


def requeue(connection: Connection, channel: RabbitChannel, acks: AckBatch, tag: int) -> None:
    """The consumer's requeue: on the connection's thread, the ledger told just before the frame."""

    def now() -> None:
        acks.settled(tag)
        channel.basic_nack(tag, requeue=True)

    connection.add_callback_threadsafe(now)


def test_a_batch_that_is_a_prefix_of_the_open_deliveries_leaves_as_one_cumulative_ack():
    connection, channel, acks = consumer(5)
    for tag in (2, 1, 3):
        acks.add(tag)
    connection.run()
    assert channel.frames == [("ack", 3, True)]
    assert channel.pending == {4, 5}


def test_acks_above_a_delivery_still_running_go_one_by_one_and_the_running_one_stays_pending():
    connection, channel, acks = consumer(6)
    for tag in (1, 2, 4, 5):
        acks.add(tag)
    connection.run()
    assert channel.frames == [("ack", 2, True), ("ack", 4, False), ("ack", 5, False)]
    assert channel.pending == {3, 6}
    acks.add(3)
    connection.run()
    assert channel.frames[-1] == ("ack", 3, False)  # alone in its batch


def test_a_delivery_requeued_earlier_does_not_stop_the_cumulative_ack_and_is_not_acked():
    connection, channel, acks = consumer(4)
    requeue(connection, channel, acks, 2)
    connection.run()
    for tag in (1, 3, 4):
        acks.add(tag)
    connection.run()
    assert channel.frames[-1] == ("ack", 4, True)
    assert channel.outcome == {1: "ack", 2: "requeue", 3: "ack", 4: "ack"}


def test_a_requeue_queued_after_the_batch_blocks_the_prefix_at_its_tag():
    connection, channel, acks = consumer(4)
    for tag in (1, 3, 4):
        acks.add(tag)
    requeue(connection, channel, acks, 2)  # its callback runs after the batch's
    connection.run()
    assert channel.outcome == {1: "ack", 2: "requeue", 3: "ack", 4: "ack"}
    assert ("ack", 4, True) not in channel.frames


def test_a_tag_the_ledger_never_saw_is_acked_on_its_own():
    connection, channel, acks = consumer(2)
    channel.deliver(7)  # delivered, but not through the ledger
    for tag in (1, 2, 7):
        acks.add(tag)
    connection.run()
    assert channel.frames == [("ack", 2, True), ("ack", 7, False)]


#: Per delivery: its finish order, and whether it is acked or requeued.
Schedule = list[tuple[int, str]]


@st.composite
def schedules(draw: Any) -> tuple[int, Schedule, list[bool]]:
    count = draw(st.integers(1, 40))
    order = draw(st.permutations(range(1, count + 1)))
    kinds = draw(st.lists(st.sampled_from(["ack", "ack", "ack", "requeue"]), min_size=count, max_size=count))
    polls = draw(st.lists(st.booleans(), min_size=count, max_size=count))
    return count, list(zip(order, kinds, strict=True)), polls


@settings(max_examples=300, deadline=None)
@given(schedules())
def test_every_delivery_is_settled_once_as_its_worker_decided(drawn: tuple[int, Schedule, list[bool]]):
    count, schedule, polls = drawn
    connection, channel, acks = consumer(count)
    for (tag, kind), poll in zip(schedule, polls, strict=True):
        if kind == "ack":
            acks.add(tag)
        else:
            requeue(connection, channel, acks, tag)
        if poll:
            connection.run()
    connection.run()
    assert channel.outcome == dict(schedule)
    assert not channel.pending


def test_the_ledger_forgets_every_settled_delivery():
    connection, channel, acks = consumer(3)
    acks.add(1)
    requeue(connection, channel, acks, 2)
    acks.add(3)
    connection.run()
    assert acks._open == set()


@pytest.mark.parametrize("finished", [[1, 2, 3, 4, 5, 6, 7, 8], [2, 1, 4, 3, 6, 5, 8, 7]])
def test_a_batch_of_eight_finished_in_any_order_is_one_frame(finished: list[int]):
    connection, channel, acks = consumer(8)
    for tag in finished:
        acks.add(tag)
    connection.run()
    assert channel.frames == [("ack", 8, True)]


def test_a_delivery_held_long_below_thousands_of_others_keeps_the_ledger_bounded():
    """A delay queue's consumer holds a delivery until it is due while thousands pass it: every
    ack above it goes alone, the held one stays pending, and the settled tags are not kept."""
    connection, channel, acks = consumer(0)
    for tag in range(1, 20_001):
        channel.deliver(tag)
        acks.delivered(tag)
        if tag > 1:
            acks.add(tag)
        if tag % 7 == 0:
            connection.run()
    connection.run()
    assert channel.pending == {1}
    assert all(not multiple for _, _, multiple in channel.frames)
    assert len(acks._order) <= 4 * len(acks._open) + 1024 + 1
    for tag in range(20_001, 20_004):
        channel.deliver(tag)
        acks.delivered(tag)
    for tag in (1, 20_001, 20_002):
        acks.add(tag)
    connection.run()
    assert channel.frames[-1] == ("ack", 20_002, True)
    assert channel.pending == {20_003}
