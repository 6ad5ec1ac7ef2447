"""Review 6 of the throughput paths: faults reproduced in-process, at the store and channel boundary.

Each test is a strict xfail: it fails today because of the fault it names, and passes once fixed.

- A keyed job's completion is written by the background writer after the job's ack has left: a
  store that does not take it at once (a failover's ``READONLY``, a timeout) and a SIGKILL then
  lose it, and a copy of the message (a publisher's retry after a lost confirm, a workflow step
  sent twice) runs the job a second time once the lease lapses.
- A dead letter whose ack found the consumer's connection gone is published again when Dramatiq
  retries the nack (``post_process_message`` retries on a connection error): two dead letters
  for one failure, besides the redelivered original.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any
from unittest import mock

import dramatiq
import pika.exceptions
import pytest
import redis
from dramatiq import worker as dramatiq_worker
from dramatiq.brokers.stub import StubBroker
from dramatiq.worker import ConsumerThread

import middleware.idempotency as idempotency_module
from jobsystem.rabbitmq.acks import AckBatch
from jobsystem.rabbitmq.consumer import DeadLetteringConsumer
from jobsystem.store.base import StateStore
from jobsystem.store.redis import redis_error
from middleware.dead_letters import HEADER_REASON
from tests.unit.idempotency_setup import Setup, set_up
from tests.unit.stub import delivery

#: The longest a test waits for the ack frame to leave (a fixed consumer may wait for the store).
ACK_WITHIN_S = 10.0


class Frames:
    """A channel's ``_impl``: notes each ack frame, and what ``on_ack`` saw when it was queued."""

    def __init__(self, on_ack: Callable[[], Any]) -> None:
        self._impl = self
        self.on_ack = on_ack
        self.acked: list[tuple[int, Any]] = []
        self.sent = threading.Event()

    def basic_ack(self, delivery_tag: int, multiple: bool = False) -> None:
        self.acked.append((delivery_tag, self.on_ack()))
        self.sent.set()

    def basic_nack(self, delivery_tag: int, requeue: bool = False) -> None:
        self.acked.append((-delivery_tag, self.on_ack()))
        self.sent.set()


class Connection:
    """The consumer's connection as its own thread runs it: callbacks at once (in order, one at a
    time), timers on a timer thread. ``lost``: every hand-off refused, as pika refuses it once the
    connection closed."""

    def __init__(self, *, lost: bool = False) -> None:
        self.lost = lost
        self._lock = threading.RLock()

    def add_callback_threadsafe(self, callback: Callable[[], None]) -> None:
        if self.lost:
            raise pika.exceptions.ConnectionWrongStateError("connection closed")
        with self._lock:
            callback()

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        timer = threading.Timer(delay, self.add_callback_threadsafe, (callback,))
        timer.daemon = True
        timer.start()


def consumer_of(broker: Any, connection: Connection, channel: Frames) -> Any:
    """The project's consumer on stand-ins for its connection and channel: its settling decisions."""
    consumer: Any = object.__new__(DeadLetteringConsumer)
    consumer.broker, consumer.queue_name = broker, "q"
    consumer.connection, consumer.channel = connection, channel
    consumer.known_tags = set()
    consumer.acks = AckBatch(connection, channel)
    return consumer


def delivered(consumer: Any, message: Any) -> Any:
    """``message`` as ``consumer`` hands it to a worker thread."""
    proxy = delivery(message)
    proxy.delivered_on = consumer
    consumer.known_tags.add(proxy.tag)
    consumer.acks.delivered(proxy.tag)
    return proxy


@pytest.fixture
def idem(store: StateStore) -> Iterator[Setup]:
    yield from set_up(store)


class StoreFailsOver:
    """The completion write while the store fails over: its first ``failures`` tries time out
    (transient: the writer retries them), then it is written."""

    __qualname__ = "_complete_many"

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.write = idempotency_module._complete_many

    def __call__(self, view: StateStore, items: list[Any]) -> None:
        if self.failures:
            self.failures -= 1
            raise redis_error(redis.exceptions.TimeoutError("Timeout reading from socket"))
        self.write(view, items)


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="review6: a keyed job's completion is written after its ack leaves (background writer); "
    "a store slow to take it plus a SIGKILL loses it, and a copy of the message runs again",
)
def test_a_keyed_jobs_ack_leaves_only_once_its_completion_is_in_the_store(
    idem: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(idempotency_module, "_complete_many", StoreFailsOver(failures=2))
    channel = Frames(on_ack=lambda: idem.state("order-7"))
    consumer = consumer_of(idem.broker, Connection(), channel)
    proxy = delivered(consumer, idem.message("order-7"))
    # What the worker thread does: the hooks, the actor (returns), the hooks, then the ack.
    idem.middleware.before_process_message(idem.broker, proxy)
    idem.middleware.after_process_message(idem.broker, proxy, result=None)
    idem.broker.emit_before("ack", proxy)
    consumer.ack(proxy)
    idem.broker.emit_after("ack", proxy)
    assert channel.sent.wait(ACK_WITHIN_S), "the ack never left"
    # The state of the key when the ack frame was queued: once acked, RabbitMQ forgets the
    # message; a completion still in this process's memory dies with it (SIGKILL, OOM kill).
    assert channel.acked == [(proxy.tag, "done")]


class DeadLetters:
    """The broker's dead-letter record and hook, as the consumer uses them."""

    def record(self, broker: Any, message: Any, exception: Any) -> dict[str, Any]:
        return {HEADER_REASON: "retries_exhausted"}

    def notify(self, broker: Any, message: Any, headers: dict[str, Any]) -> None:
        return None


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="review6: a nack whose ack found the consumer's connection lost is retried by Dramatiq "
    "and publishes the dead letter a second time",
)
def test_a_nack_retried_after_its_connection_was_lost_publishes_one_dead_letter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dramatiq_worker, "POST_PROCESS_MESSAGE_RETRY_DELAY_SECS", 0)
    published = mock.Mock()
    broker = SimpleNamespace(
        dead_letters=DeadLetters(), publish_dead_letter=published, refused_follow_ups=mock.Mock()
    )
    consumer = consumer_of(broker, Connection(lost=True), Frames(on_ack=lambda: None))
    stub = StubBroker()
    proxy = delivered(consumer, dramatiq_message(stub))
    proxy.fail()
    thread: Any = object.__new__(ConsumerThread)  # Dramatiq's own settling loop, as a worker thread runs it
    thread.broker, thread.consumer, thread.logger = stub, consumer, mock.Mock()
    thread.post_process_message(proxy)
    # RabbitMQ redelivers the original (its channel closed): that delivery decides again. The
    # retry of this one must not publish a second dead letter for the same attempt.
    assert published.call_count == 1


def dramatiq_message(broker: StubBroker) -> Any:
    @dramatiq.actor(broker=broker, queue_name="q", max_retries=0)
    def doomed() -> None: ...

    return doomed.message()
