"""The broker's per-thread RabbitMQ connections, with pika's connection faked: closing the broker
while another thread opens or closes its own, and the connection of a thread the watchdog
replaces (the real RabbitMQ count: ``tests/integration/test_thread_connections.py``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import pika
import pytest

from jobsystem.rabbitmq.broker import ProjectBroker
from middleware.watchdog import ThreadWatchdog

#: How long the thread racing close() is given to open or close its connection meanwhile. It
#: cannot while close() holds the broker's lock, so with the lock this is the time waited.
RACE_WAIT_S = 1.0


class FakeChannel:
    def __init__(self, connection: FakeConnection) -> None:
        self.connection = connection
        self.is_open = True

    def confirm_delivery(self) -> None:
        pass

    def close(self) -> None:
        self.is_open = False


class FakeConnection:
    """A pika connection that opens nothing; ``on_close`` runs inside the first ``close()``."""

    on_close: Callable[[], None] | None = None

    def __init__(self, parameters: Any = None) -> None:
        self.is_open = True

    def channel(self) -> FakeChannel:
        return FakeChannel(self)

    def close(self) -> None:
        self.is_open = False
        hook, FakeConnection.on_close = FakeConnection.on_close, None
        if hook is not None:
            hook()


@pytest.fixture
def broker(monkeypatch: pytest.MonkeyPatch) -> ProjectBroker:
    monkeypatch.setattr(pika, "BlockingConnection", FakeConnection)
    monkeypatch.setattr(FakeConnection, "on_close", None)
    return ProjectBroker(environment="", url="amqp://127.0.0.1:1/", middleware=[])


def _in_thread(work: Callable[[], Any]) -> tuple[threading.Thread, threading.Event, list[BaseException]]:
    """A started thread running ``work`` once the test lets it (``go``); what it raised."""
    go, raised = threading.Event(), []

    def run() -> None:
        go.wait()
        try:
            work()
        except BaseException as exc:  # reported to the test
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, go, raised


@pytest.mark.parametrize("race", ["opens", "closes its own"])
def test_close_is_safe_while_another_thread_opens_or_closes_its_connection(broker, race):
    """Dramatiq's close() walked the set of connections while another thread added or removed
    its own: ``RuntimeError: Set changed size during iteration``, and the rest left open."""
    mine = broker.connection
    barrier = threading.Barrier(2, timeout=10)
    theirs: list[Any] = []

    def opens() -> None:
        barrier.wait()
        theirs.append(broker.connection)

    def closes_its_own() -> None:
        theirs.append(broker.connection)
        barrier.wait()
        del broker.connection

    other, go, raised = _in_thread(opens if race == "opens" else closes_its_own)
    if race == "closes its own":
        go.set()
        while not theirs:  # its connection is open before close() starts
            other.join(0.01)

    def start_race() -> None:  # from inside close(), once it is walking the connections
        go.set()
        barrier.wait()
        other.join(RACE_WAIT_S)

    FakeConnection.on_close = start_race
    broker.close()
    other.join(10)

    assert not other.is_alive() and raised == []
    assert not mine.is_open
    if race == "opens":
        # Registered once close() was done, as on a broker used after close(): its thread's own.
        assert theirs[0].is_open and theirs[0] in broker.connections
    else:
        assert not theirs[0].is_open and theirs[0] not in broker.connections


class DeadWorkerThread(threading.Thread):
    """A worker thread that did broker work (a publish opens its connection and channel) and then
    died while meant to be running, as one an exception escaped from."""

    def __init__(self, broker: ProjectBroker) -> None:
        super().__init__(daemon=True)
        self.broker = broker
        self.running = True
        self.opened: list[Any] = []

    def run(self) -> None:
        self.opened += [self.broker.connection, self.broker.channel]


class FakeWorker:
    def __init__(self, broker: ProjectBroker, workers: list[threading.Thread]) -> None:
        self.broker = broker
        self.workers = workers
        self.consumers: dict[str, Any] = {}

    def _add_worker(self) -> None:
        self.workers.append(threading.Thread())  # the replacement (not started)


def test_the_watchdog_closes_the_connection_of_a_worker_thread_it_replaces(broker, caplog):
    live = broker.connection  # this thread's, alive: kept
    dead = DeadWorkerThread(broker)
    dead.start()
    dead.join(10)
    connection, channel = dead.opened
    worker = FakeWorker(broker, [dead])

    with caplog.at_level(logging.INFO, logger="middleware.watchdog"):
        assert ThreadWatchdog().replace_dead(worker) == 1  # type: ignore[arg-type]

    assert not connection.is_open
    assert connection not in broker.connections and channel not in broker.channels
    assert live.is_open and broker.connections == {live}
    closed = [r for r in caplog.records if r.getMessage() == "dead_thread_connections_closed"]
    assert [getattr(r, "connections", None) for r in closed] == [1]


def test_a_thread_releasing_its_connection_leaves_nothing_to_close(broker):
    def publish_then_release() -> None:
        assert broker.channel.is_open
        del broker.connection

    thread, go, raised = _in_thread(publish_then_release)
    go.set()
    thread.join(10)
    assert raised == [] and broker.connections == set() and broker.channels == set()
    assert broker.close_ended_threads() == 0


class _DeadConsumer:
    """A consumer thread that died, whose connection RabbitMQ already dropped: closing it raises
    pika's error, whose text names RabbitMQ's address."""

    broker, prefetch, work_queue, worker_timeout, name = None, 1, None, 1000, "consumer-q"

    def close(self) -> None:
        raise pika.exceptions.StreamLostError("Stream connection lost: 10.0.0.5:5672")


class _Replacement:
    def __init__(self, **kwargs: Any) -> None:
        self.started = False

    def start(self) -> None:
        self.started = True


def test_a_dead_consumer_whose_close_fails_is_replaced_and_logged_by_class(monkeypatch, caplog):
    """The WARNING (Sentry's breadcrumbs and events) named pika's text, RabbitMQ's host and port
    with it: now the error's class, the text at DEBUG only."""
    monkeypatch.setattr("middleware.watchdog.ConsumerThread", _Replacement)
    worker = FakeWorker(None, [])  # type: ignore[arg-type]
    with caplog.at_level(logging.DEBUG, logger="middleware.watchdog"):
        ThreadWatchdog._replace_consumer(worker, "q", _DeadConsumer())  # type: ignore[arg-type]
    assert worker.consumers["q"].started
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.getMessage() == "dead_consumer_close_failed" and not warning.exc_info
    assert "10.0.0.5" not in str(vars(warning))
    assert any("10.0.0.5" in str(vars(r)) for r in caplog.records if r.levelno == logging.DEBUG)
