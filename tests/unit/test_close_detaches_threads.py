"""After a broker's ``close()`` gave up on a close, no thread is handed the connection a helper
thread is still closing.

``ThreadConnections.close()`` closes each connection (its channels first) on a helper thread and
returns after the bound, the close perhaps still waiting for RabbitMQ's ``Channel.CloseOk``. Review
4 of ``fix/leftovers`` found every thread's thread-local still holding its connection, open: the
thread's next publish or declare ran on the very connection the helper thread was pumping, two
threads in one pika ``BlockingConnection``, which is not thread-safe. ``close()`` now takes every
connection and channel from its thread first (as ``del broker.connection`` and the watchdog's
round do): a thread's next use opens a new one, and its release closes nothing twice.
"""

from __future__ import annotations

import threading

from jobsystem.rabbitmq.broker import ProjectBroker
from tests.support import within
from tests.unit.test_bounded_closes import RETURNS_WITHIN_S, broker, silent

#: The fixtures of the merge's own tests: a RabbitMQ that never answers a close, and a broker
#: on it whose closes are given up after 0.2 s.
__all__ = ["broker", "silent"]


def closing_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("close-") and t.is_alive()]


def test_after_a_close_given_up_no_thread_is_handed_the_connection_being_closed(
    broker: ProjectBroker,
) -> None:
    def close_then_use() -> tuple[object, object, bool]:
        first = broker.connection
        assert broker.channel.is_open
        broker.close()  # given up after 0.2 s: a helper thread waits for Channel.CloseOk
        after = broker.connection  # what this thread's next publish or declare runs on
        return first, after, after.is_open

    first, after, still_open = within(RETURNS_WITHIN_S, close_then_use)
    assert closing_threads(), "the close was answered: nothing to race"
    assert not (after is first and still_open), "handed the open connection a helper thread is closing"


def test_after_a_close_given_up_a_thread_publishes_on_a_new_channel_of_a_new_connection(
    broker: ProjectBroker,
) -> None:
    def close_then_publish() -> tuple[object, object, object]:
        first, channel = broker.connection, broker.channel
        broker.close()
        return first, channel, broker.channel  # what Dramatiq's enqueue publishes on

    first, channel, after = within(RETURNS_WITHIN_S, close_then_publish)
    assert closing_threads(), "the close was answered: nothing to race"
    assert after is not channel and after.connection is not first


def test_a_thread_releasing_after_a_close_given_up_closes_nothing_twice(broker: ProjectBroker) -> None:
    """Its release (a dashboard request's end) leaves the connection to the helper closing it: a
    second close would run on a second helper thread, in the same pika connection."""

    def close_then_release() -> tuple[int, int]:
        assert broker.channel.is_open
        broker.close()
        closing = len(closing_threads())
        del broker.connection
        return closing, len(closing_threads())

    closing, after_release = within(RETURNS_WITHIN_S, close_then_release)
    assert closing and after_release == closing


def test_a_thread_releasing_its_connection_first_is_handed_a_new_one(broker: ProjectBroker) -> None:
    """The control: ``del broker.connection`` takes the connection from its thread before its close."""

    def release_then_use() -> bool:
        first = broker.connection
        assert broker.channel.is_open
        del broker.connection  # given up after 0.2 s, as above
        return vars(broker.state).get("connection") is first

    assert within(RETURNS_WITHIN_S, release_then_use) is False
