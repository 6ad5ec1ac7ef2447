"""Closing RabbitMQ connections when RabbitMQ stopped answering: every close returns.

pika's close waits for RabbitMQ's ``Close-Ok``. A peer that no longer answers (here a stand-in
that never answers a close, with heartbeats off) held each close for as long as the socket stayed
open: a worker's shutdown, the watchdog's round closing a replaced thread's connection, a thread
releasing its own. Now each waits a bounded time, and what it gave up on is logged by class.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from jobsystem.dramatiq_internals import release_thread_connection
from jobsystem.rabbitmq.broker import ProjectBroker
from jobsystem.rabbitmq.consumer import DeadLetteringConsumer
from jobsystem.runtime.closing import BoundedCloses
from tests.amqp_server import FakeRabbit, fake_rabbitmq
from tests.support import within

#: What a test waits, at most, for a close that must return (far above the bound it sets).
RETURNS_WITHIN_S = 10.0


@pytest.fixture
def silent() -> Iterator[FakeRabbit]:
    """A RabbitMQ that opens connections and channels but never answers a close. When the test
    ends its sockets are shut down: the closes given up on return, and their threads end."""
    with fake_rabbitmq(answer_close=False) as rabbit:
        yield rabbit
    for thread in threading.enumerate():
        if thread.name.startswith("close-"):
            thread.join(RETURNS_WITHIN_S)


@pytest.fixture
def broker(silent: FakeRabbit) -> ProjectBroker:
    broker = ProjectBroker(environment="", url=silent.url(), middleware=[])
    broker.closes = BoundedCloses(timeout=0.2, after_silence=0.1)
    return broker


def timed_out(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    """``(level, kind)`` of each ``connection_close_timed_out`` line."""
    lines = [r for r in caplog.records if r.getMessage() == "connection_close_timed_out"]
    return [(r.levelno, r.kind) for r in lines]  # type: ignore[attr-defined]


def opened_in_thread(broker: ProjectBroker, then: Callable[[], Any] = lambda: None) -> None:
    """Open a connection and channel of ``broker`` on a thread of their own, which then ends."""
    thread = threading.Thread(target=lambda: (broker.channel, then()), daemon=True)
    thread.start()
    thread.join(RETURNS_WITHIN_S)
    assert not thread.is_alive()


def test_a_thread_releasing_its_connection_returns(broker, caplog):
    """A dashboard request thread or a timer ends its broker work with this release."""

    def publish_then_release() -> None:
        assert broker.channel.is_open
        release_thread_connection(broker)

    assert within(RETURNS_WITHIN_S, publish_then_release) is None
    assert timed_out(caplog) == [(logging.WARNING, "BlockingConnection")]
    assert broker.connections == set() and broker.channels == set()


def test_the_watchdog_closing_a_dead_threads_connection_returns(broker, caplog):
    opened_in_thread(broker)
    assert within(RETURNS_WITHIN_S, broker.close_ended_threads) == 1
    assert timed_out(caplog) == [(logging.WARNING, "BlockingConnection")]


def test_closing_the_broker_returns_and_names_each_connection_given_up(broker, caplog):
    """A worker's shutdown closes the broker: each thread's connection at once, in one bound."""
    assert broker.channel.is_open  # this thread's
    opened_in_thread(broker)  # an ended thread's, left open
    assert within(RETURNS_WITHIN_S, broker.close) is None
    assert timed_out(caplog) == [(logging.WARNING, "BlockingConnection")] * 2


def test_closing_a_consumer_returns(broker, caplog):
    """A worker's shutdown closes each consumer, after the threads stopped; so does the watchdog
    replacing a dead consumer thread, and a consumer restarting after a lost connection."""
    consumer = DeadLetteringConsumer(broker, "q", prefetch=1, timeout=100)
    assert within(RETURNS_WITHIN_S, consumer.close) is None
    assert timed_out(caplog) == [(logging.WARNING, "DeadLetteringConsumer")]


class Close:
    """A close that returns when ``answered`` is set, and raises ``error`` then if it has one."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.answered = threading.Event()
        self.error = error

    def __call__(self) -> None:
        self.answered.wait(RETURNS_WITHIN_S)
        if self.error is not None:
            raise self.error


def waited(caplog: pytest.LogCaptureFixture) -> list[float]:
    return [r.waited_s for r in caplog.records if r.getMessage() == "connection_close_timed_out"]  # type: ignore[attr-defined]


def test_after_a_close_given_up_the_next_wait_briefly_until_one_is_answered(caplog):
    """A shutdown closes each consumer in turn: a silent node cost each of them the whole bound."""
    closes = BoundedCloses(timeout=0.3, after_silence=0.05)
    unanswered = [Close() for _ in range(3)]
    try:
        closes.run([(object(), unanswered[0])])
        closes.run([(object(), unanswered[1])])
        answered = Close()
        answered.answered.set()
        closes.run([(object(), answered)])
        assert not closes.silent
        closes.run([(object(), unanswered[2])])
    finally:
        for close in unanswered:
            close.answered.set()
    assert waited(caplog) == [0.3, 0.05, 0.3]


def test_an_error_of_a_close_that_returned_is_raised_to_the_caller():
    """Dramatiq's consumer raises ``ConnectionClosed`` from a failed close; its callers catch it."""
    closes = BoundedCloses(timeout=5.0)
    failing = Close(ConnectionError("lost"))
    failing.answered.set()
    with pytest.raises(ConnectionError, match="lost"):
        closes.run([(object(), failing)])
