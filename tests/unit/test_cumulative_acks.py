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
    """Runs callbacks when told to, as the connection's thread does at its next poll, and timers
    when their time has come on a clock the test moves."""

    def __init__(self) -> None:
        self.callbacks: list[Callable[[], None]] = []
        self.timers: list[tuple[float, Callable[[], None]]] = []
        self.now = 0.0

    def add_callback_threadsafe(self, callback: Callable[[], None]) -> None:
        self.callbacks.append(callback)

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        self.timers.append((self.now + delay, callback))

    def run(self) -> None:
        callbacks, self.callbacks = self.callbacks, []
        for callback in callbacks:
            callback()

    def advance(self, seconds: float) -> None:
        """Move the clock, then run the timers due, as the poll loop would."""
        self.now += seconds
        due = [callback for at, callback in self.timers if at <= self.now]
        self.timers = [(at, callback) for at, callback in self.timers if at > self.now]
        for callback in due:
            callback()


HOLD_S, YOUNG_S = 0.01, 0.05


def consumer(deliveries: int, *, hold: bool = False) -> tuple[Connection, RabbitChannel, AckBatch]:
    connection, channel = Connection(), RabbitChannel()
    acks = AckBatch(
        connection,
        channel,
        hold_s=HOLD_S if hold else 0.0,
        young_s=YOUNG_S,
        clock=lambda: connection.now,
    )
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


def test_acks_above_a_young_open_delivery_wait_for_it_and_leave_with_it_in_one_cumulative_ack():
    connection, channel, acks = consumer(6, hold=True)
    for tag in (1, 2, 4, 5):
        acks.add(tag)
    connection.run()
    assert channel.frames == [("ack", 2, True)]  # 4 and 5 wait for 3
    assert channel.pending == {3, 4, 5, 6}
    connection.advance(HOLD_S / 2)
    acks.add(3)
    connection.run()
    assert channel.frames == [("ack", 2, True), ("ack", 5, True)]
    assert channel.pending == {6}
    connection.advance(HOLD_S)  # the release finds nothing left to send
    assert len(channel.frames) == 2


def test_a_batch_with_nothing_above_an_open_delivery_schedules_no_release():
    connection, channel, acks = consumer(5, hold=True)
    for tag in (1, 2, 3):
        acks.add(tag)
    connection.run()
    assert channel.frames == [("ack", 3, True)]
    assert not connection.timers


def test_held_acks_leave_one_by_one_when_the_hold_ends_and_the_delivery_below_still_runs():
    connection, channel, acks = consumer(6, hold=True)
    for tag in (1, 2, 4, 5):
        acks.add(tag)
    connection.run()
    connection.advance(HOLD_S * 0.99)
    assert channel.frames == [("ack", 2, True)]
    connection.advance(HOLD_S * 0.02)
    assert channel.frames == [("ack", 2, True), ("ack", 4, False), ("ack", 5, False)]
    assert channel.pending == {3, 6}


def test_acks_behind_a_delivery_handed_out_long_ago_go_at_once():
    """A long job (or a delayed message) below them: waiting would only hold prefetch slots."""
    connection, channel, acks = consumer(2, hold=True)
    connection.advance(YOUNG_S)
    for tag in (3, 4):
        channel.deliver(tag)
        acks.delivered(tag)
    for tag in (1, 3, 4):
        acks.add(tag)
    connection.run()
    assert channel.frames == [("ack", 1, False), ("ack", 3, False), ("ack", 4, False)]
    assert not connection.timers


def test_a_release_sends_what_is_held_at_once():
    """What the consumer calls before its channel closes: nothing acked is left to redeliver."""
    connection, channel, acks = consumer(4, hold=True)
    for tag in (1, 3, 4):
        acks.add(tag)
    connection.run()
    acks.release_held()
    assert channel.frames == [("ack", 1, False), ("ack", 3, False), ("ack", 4, False)]
    assert channel.pending == {2}


#: Per delivery: its finish order, and whether it is acked or requeued.
Schedule = list[tuple[int, str]]
#: After each settlement: whether the connection's thread polls, and how long passes.
Polls = list[tuple[bool, float]]


@st.composite
def schedules(draw: Any) -> tuple[int, Schedule, Polls]:
    count = draw(st.integers(1, 40))
    order = draw(st.permutations(range(1, count + 1)))
    kinds = draw(st.lists(st.sampled_from(["ack", "ack", "ack", "requeue"]), min_size=count, max_size=count))
    pauses = st.sampled_from([0.0, 0.0, HOLD_S / 3, HOLD_S, YOUNG_S])
    polls = draw(st.lists(st.tuples(st.booleans(), pauses), min_size=count, max_size=count))
    return count, list(zip(order, kinds, strict=True)), polls


@settings(max_examples=300, deadline=None)
@given(schedules(), st.booleans())
def test_every_delivery_is_settled_once_as_its_worker_decided(drawn: tuple[int, Schedule, Polls], hold: bool):
    count, schedule, polls = drawn
    connection, channel, acks = consumer(count, hold=hold)
    for (tag, kind), (poll, pause) in zip(schedule, polls, strict=True):
        if kind == "ack":
            acks.add(tag)
        else:
            requeue(connection, channel, acks, tag)
        if poll:
            connection.run()
        connection.advance(pause)
    connection.run()
    acks.release_held()  # the consumer closes
    assert channel.outcome == dict(schedule)
    assert not channel.pending


def test_the_ledger_forgets_every_settled_delivery():
    connection, channel, acks = consumer(3)
    acks.add(1)
    requeue(connection, channel, acks, 2)
    acks.add(3)
    connection.run()
    assert not acks._open


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
