"""The broker's hook dispatch (``jobsystem.rabbitmq.dispatch``) keeps Dramatiq's rules while it
skips empty hooks, and the consumer's ack batches (``jobsystem.rabbitmq.acks``) ack every
delivery once, in order, with one hand-off per batch."""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import MethodType
from typing import Any, cast

import pika.exceptions
import pytest
from dramatiq import Message
from dramatiq.brokers.stub import StubBroker
from dramatiq.errors import ConnectionClosed
from dramatiq.middleware import Middleware, MiddlewareError

from jobsystem.rabbitmq.acks import AckBatch, check_pika_contract
from jobsystem.rabbitmq.dispatch import HookDispatch


class DispatchingBroker(HookDispatch, StubBroker):
    pass


class Noted(Middleware):
    def __init__(self, name: str, calls: list[str], error: BaseException | None = None) -> None:
        self.name, self.calls, self.error = name, calls, error

    def before_enqueue(self, broker: Any, message: Any, delay: Any) -> None:
        self.calls.append(f"before {self.name}")
        if self.error is not None:
            raise self.error

    def after_enqueue(self, broker: Any, message: Any, delay: Any) -> None:
        self.calls.append(f"after {self.name}")
        if self.error is not None:
            raise self.error


class Silent(Middleware):
    """Defines no enqueue hook: never called for it."""


def message() -> Message[Any]:
    return Message(queue_name="q", actor_name="job", args=(), kwargs={}, options={})


def test_hooks_run_in_dramatiqs_order_and_only_where_defined():
    calls: list[str] = []
    broker = DispatchingBroker(middleware=[Noted("a", calls), Silent(), Noted("b", calls)])
    broker.emit_before("enqueue", message(), None)
    broker.emit_after("enqueue", message(), None)
    assert calls == ["before a", "before b", "after b", "after a"]
    hooks = broker._listeners("before_enqueue", reverse=False)
    assert [cast(MethodType, hook).__self__ for hook in hooks] == [broker.middleware[0], broker.middleware[2]]


def test_a_middleware_error_reaches_the_caller_and_any_other_is_logged_and_passed(caplog):
    calls: list[str] = []
    broker = DispatchingBroker(middleware=[Noted("bug", calls, RuntimeError("bug")), Noted("b", calls)])
    broker.emit_before("enqueue", message(), None)
    broker.emit_after("enqueue", message(), None)
    assert calls == ["before bug", "before b", "after b", "after bug"]
    assert "Unexpected failure in before_enqueue of <tests.unit.test_dispatch_acks.Noted" in caplog.text
    refusing = DispatchingBroker(
        middleware=[Noted("no", calls, MiddlewareError("refused")), Noted("c", calls)]
    )
    with pytest.raises(MiddlewareError):
        refusing.emit_before("enqueue", message(), None)
    assert "before c" not in calls
    refusing.emit_after("enqueue", message(), None)  # swallowed, as Dramatiq does
    assert calls[-2:] == ["after c", "after no"]


def test_middleware_added_or_removed_later_are_seen_at_once():
    calls: list[str] = []
    broker = DispatchingBroker(middleware=[Noted("a", calls)])
    broker.emit_before("enqueue", message(), None)
    late = Noted("late", calls)
    broker.add_middleware(late)
    broker.emit_before("enqueue", message(), None)
    broker.middleware.remove(late)
    broker.emit_before("enqueue", message(), None)
    assert calls == ["before a", "before a", "before late", "before a"]


def test_the_project_broker_dispatches_this_way():
    from jobsystem.rabbitmq.broker import ProjectBroker

    assert ProjectBroker.emit_before is HookDispatch.emit_before
    assert ProjectBroker.emit_after is HookDispatch.emit_after


# -- acks ----------------------------------------------------------------------------------------


class FakeImpl:
    def __init__(self, sent: list[Any]) -> None:
        self.sent = sent

    def basic_ack(self, delivery_tag: int, multiple: bool) -> None:
        self.sent.append(("ack", delivery_tag, multiple))


class FakeChannel:
    def __init__(self) -> None:
        self.sent: list[Any] = []
        self._impl = FakeImpl(self.sent)


class FakeConnection:
    """Holds callbacks until ``run()``, as the connection's thread would until its next poll."""

    def __init__(self) -> None:
        self.callbacks: list[Callable[[], None]] = []
        self.closed = False

    def add_callback_threadsafe(self, callback: Callable[[], None]) -> None:
        if self.closed:
            raise pika.exceptions.ConnectionWrongStateError("closed")
        self.callbacks.append(callback)

    def run(self) -> None:
        callbacks, self.callbacks = self.callbacks, []
        for callback in callbacks:
            callback()


def test_acks_finished_before_the_connections_thread_runs_leave_together_in_order():
    connection, channel = FakeConnection(), FakeChannel()
    acks = AckBatch(connection, channel)
    for tag in (3, 1, 2):
        acks.add(tag)
    assert len(connection.callbacks) == 1  # one hand-off for the batch
    connection.run()
    assert channel.sent == [("ack", 3, False), ("ack", 1, False), ("ack", 2, False)]
    acks.add(4)  # a new batch after the first went
    assert len(connection.callbacks) == 1
    connection.run()
    assert channel.sent[-1:] == [("ack", 4, False)]


def test_acks_from_many_threads_are_each_sent_once():
    connection, channel = FakeConnection(), FakeChannel()
    acks = AckBatch(connection, channel)
    start = threading.Barrier(8)

    def worker(base: int) -> None:
        start.wait()
        for i in range(500):
            acks.add(base * 1000 + i)
            if i % 50 == 0:
                connection.run()

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    connection.run()
    tags = [item[1] for item in channel.sent]
    assert sorted(tags) == sorted(n * 1000 + i for n in range(8) for i in range(500))


def test_a_closed_connection_raises_connection_closed_and_the_next_batch_still_goes():
    connection, channel = FakeConnection(), FakeChannel()
    acks = AckBatch(connection, channel)
    connection.closed = True
    with pytest.raises(ConnectionClosed):
        acks.add(1)
    connection.closed = False
    acks.add(2)  # not stuck behind the lost batch: it schedules its own hand-off
    connection.run()
    assert channel.sent == [("ack", 2, False)]


def test_pika_still_has_what_the_ack_batch_relies_on():
    assert check_pika_contract() == []
