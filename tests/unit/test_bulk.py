"""Bulk send: confirmed means in the queue; a nack names the messages that did not make it. Here
against a stand-in RabbitMQ whose answers a test withholds: an interrupt mid-publish, a broker
that never answers a close, a node that hangs while opening."""

from __future__ import annotations

import logging
import time
from typing import Any

import dramatiq
import pika.frame
import pytest
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.middleware.shutdown import Shutdown
from dramatiq.middleware.time_limit import TimeLimitExceeded

import actors  # noqa: F401 - the global broker, as an application that sends has it
from jobsystem.rabbitmq.bulk import BulkSendError, send_bulk
from jobsystem.rabbitmq.bulk_publisher import Publisher
from tests.amqp_server import FakeRabbit, fake_rabbitmq
from tests.servers import free_port
from tests.support import within


class Recorder(dramatiq.Middleware):
    """Notes the message id of each ``after_enqueue`` and of each message handed to ``on_unsent_batch``."""

    def __init__(self) -> None:
        self.enqueued: list[str] = []
        self.unsent: list[str] = []

    def after_enqueue(self, broker: dramatiq.Broker, message: dramatiq.Message[Any], delay: Any) -> None:
        self.enqueued.append(message.message_id)

    def on_unsent_batch(self, broker: dramatiq.Broker, messages: list[dramatiq.Message[Any]]) -> None:
        self.unsent += [m.message_id for m in messages]


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


def broker_of(rabbit: FakeRabbit, recorder: Recorder, monkeypatch: pytest.MonkeyPatch) -> RabbitmqBroker:
    """A broker on the stand-in, its queues taken as declared (the stand-in knows no queues)."""
    broker = RabbitmqBroker(url=rabbit.url(), middleware=[recorder])
    monkeypatch.setattr(broker, "declare_queue", lambda queue_name, ensure=False: None)
    return broker


def messages(count: int) -> list[dramatiq.Message[Any]]:
    return [
        dramatiq.Message(queue_name="bulk", actor_name="a", args=(i,), kwargs={}, options={})
        for i in range(count)
    ]


def ids(batch: list[dramatiq.Message[Any]]) -> list[str]:
    return [m.message_id for m in batch]


def test_empty_bulk_send_publishes_nothing():
    assert send_bulk([]) == []


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt(), TimeLimitExceeded(), Shutdown()], ids=type)
def test_an_interrupt_mid_publish_gives_back_only_the_unconfirmed_and_closes_the_connection(
    monkeypatch, recorder, interrupt
):
    """Raised in the sending thread after 5 confirms (Ctrl-C, or Dramatiq's time limit when a
    fan-out actor sends): the 5 confirmed ones are enqueued and keep their keys, only the 15
    others are given back, the socket is closed, and the interrupt goes on unchanged."""
    on_confirm = Publisher._on_confirm
    publishers: list[Publisher] = []

    def interrupted(publisher: Publisher, frame: pika.frame.Method) -> None:
        on_confirm(publisher, frame)
        publishers.append(publisher)
        if len(publisher.confirmed) == 5:
            raise interrupt

    monkeypatch.setattr(Publisher, "_on_confirm", interrupted)
    batch = messages(20)
    with fake_rabbitmq() as rabbit:
        broker = broker_of(rabbit, recorder, monkeypatch)
        with pytest.raises(type(interrupt)) as caught:
            send_bulk(batch, broker=broker)
        assert caught.value is interrupt
        assert recorder.enqueued == ids(batch[:5])
        assert recorder.unsent == ids(batch[5:])
        assert rabbit.closed.wait(5), "the connection was left open"
        assert publishers[0].connection is not None and publishers[0].connection.is_closed


def test_a_send_returns_when_rabbitmq_never_answers_the_close_after_confirming_all(monkeypatch, recorder):
    """Every message confirmed, then silence: the close is awaited at most ``timeout``, then the
    socket is dropped and the send returns them all."""
    batch = messages(20)
    with fake_rabbitmq(answer_close=False) as rabbit:
        broker = broker_of(rabbit, recorder, monkeypatch)
        assert within(10, lambda: send_bulk(batch, broker=broker, timeout=0.5)) == batch
        assert rabbit.closed.wait(5), "the connection was left open"
    assert recorder.enqueued == ids(batch) and recorder.unsent == []


def test_a_send_fails_when_rabbitmq_goes_silent_and_never_answers_the_close(monkeypatch, recorder):
    """5 of 20 confirmed, then nothing: no confirm within ``timeout`` fails the send, whose close is
    not answered either; the send still returns, naming the 15."""
    batch = messages(20)
    with fake_rabbitmq(acks=5, answer_close=False) as rabbit:
        broker = broker_of(rabbit, recorder, monkeypatch)
        error = within(10, lambda: send_bulk(batch, broker=broker, timeout=0.5))
        assert rabbit.closed.wait(5), "the connection was left open"
    assert isinstance(error, BulkSendError) and "no confirm within 0.5 s" in str(error)
    assert error.error_class == "TimeoutError"  # what a user may see: the failure by its class
    assert ids(error.confirmed) == ids(batch[:5]) and ids(error.failed) == ids(batch[5:])
    assert recorder.unsent == ids(batch[5:])


def test_a_send_fails_when_the_channel_never_opens(monkeypatch, recorder):
    batch = messages(3)
    with fake_rabbitmq(open_channel=False, answer_close=False) as rabbit:
        broker = broker_of(rabbit, recorder, monkeypatch)
        error = within(10, lambda: send_bulk(batch, broker=broker, timeout=0.5))
        assert rabbit.closed.wait(5), "the connection was left open"
    assert isinstance(error, BulkSendError) and len(error.failed) == 3
    assert rabbit.published == []


def assert_no_traceback(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str], pika_tracebacks: list[str]
) -> None:
    """Nothing logged with a traceback, pika's records included (as pika logged them: ``caplog``
    sees them stripped, see the ``pika_tracebacks`` fixture), and none on stderr: a node given up
    is a handled case, which the send reports itself."""
    with_traceback = [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.exc_info]
    assert with_traceback + pika_tracebacks == []
    stderr = capfd.readouterr().err
    assert "Traceback" not in stderr and "AssertionError" not in stderr + caplog.text, stderr


def bulk_lines(records: list[logging.LogRecord]) -> list[str]:
    """The lines the bulk send logged: from ``jobsystem.rabbitmq.bulk`` and, since the publisher
    has its own module, ``jobsystem.rabbitmq.bulk_publisher`` (matched by name alone, a check of
    the first saw none of the publisher's lines, and could not fail on one)."""
    return [r.getMessage() for r in records if r.name.startswith("jobsystem.rabbitmq.bulk")]


def test_the_bulk_lines_checked_are_the_senders_and_the_publishers():
    def record(name: str) -> logging.LogRecord:
        return logging.LogRecord(name, logging.WARNING, __file__, 1, f"from {name}", None, None)

    names = ["jobsystem.rabbitmq.bulk", "jobsystem.rabbitmq.bulk_publisher", "pika.adapters", "dramatiq"]
    assert bulk_lines([record(name) for name in names]) == [f"from {name}" for name in names[:2]]


@pytest.mark.parametrize("bound", ["stack_timeout", "timeout"])
def test_a_node_that_hangs_while_opening_is_given_up(
    monkeypatch, recorder, bound, caplog, capfd, pika_tracebacks
):
    """A TCP peer that accepts and never speaks AMQP: pika's ``stack_timeout`` (from the URL) gives
    the node up as unreachable, and the send's own ``timeout`` bounds a longer one, without a
    traceback (pika's ``close()`` of a connection still opening logged an AssertionError)."""
    caplog.set_level(logging.WARNING)
    batch = messages(3)
    with fake_rabbitmq(speak=False) as rabbit:
        broker = broker_of(rabbit, recorder, monkeypatch)
        parameters: Any = broker.parameters  # one URL: pika's URLParameters (typed as the list of many)
        parameters.stack_timeout = 0.5 if bound == "stack_timeout" else 60
        started = time.monotonic()
        error = within(
            10, lambda: send_bulk(batch, broker=broker, timeout=60 if bound == "stack_timeout" else 0.5)
        )
        assert rabbit.closed.wait(5), "the connection was left open"
    assert time.monotonic() - started < 5
    assert isinstance(error, BulkSendError) and len(error.failed) == 3
    assert ("connection failed" if bound == "stack_timeout" else "not connected within") in str(error)
    assert error.error_class == ("ConnectionOpenAborted" if bound == "stack_timeout" else "TimeoutError")
    assert_no_traceback(caplog, capfd, pika_tracebacks)


def test_an_interrupt_just_after_a_node_is_given_up_while_opening_drops_it_once(
    monkeypatch, recorder, caplog, capfd, pika_tracebacks
):
    """The send's ``timeout`` gives a node up in pika's pause between connection attempts (the
    port refuses), and an interrupt comes before pika's loop turns again: the connection attempt is
    aborted once (twice, pika reported its end twice, a TypeError with a traceback), the interrupt
    goes on unchanged and every message's key is given back."""
    on_timeout = Publisher._on_timeout

    def then_interrupted(publisher: Publisher) -> None:
        on_timeout(publisher)
        raise KeyboardInterrupt

    monkeypatch.setattr(Publisher, "_on_timeout", then_interrupted)
    caplog.set_level(logging.WARNING)
    batch = messages(3)
    url = f"amqp://guest:guest@127.0.0.1:{free_port()}/%2F?connection_attempts=2&retry_delay=30"
    broker = RabbitmqBroker(url=url, middleware=[recorder])
    monkeypatch.setattr(broker, "declare_queue", lambda queue_name, ensure=False: None)
    assert isinstance(within(10, lambda: send_bulk(batch, broker=broker, timeout=0.5)), KeyboardInterrupt)
    assert recorder.unsent == ids(batch) and recorder.enqueued == []
    assert_no_traceback(caplog, capfd, pika_tracebacks)


def test_the_next_node_is_tried_when_one_hangs_while_opening_past_the_send_timeout(
    monkeypatch, recorder, caplog, capfd, pika_tracebacks
):
    """The first node accepts TCP and never speaks AMQP, its ``stack_timeout`` longer than the
    send's ``timeout``: the timeout gives it up (a warning, no traceback), and (nothing published
    there) the second node, which works, gets every message."""
    caplog.set_level(logging.WARNING)
    batch = messages(5)
    with fake_rabbitmq(speak=False) as hung, fake_rabbitmq() as rabbit:
        broker = RabbitmqBroker(url=[hung.url(), rabbit.url()], middleware=[recorder])
        monkeypatch.setattr(broker, "declare_queue", lambda queue_name, ensure=False: None)
        broker.parameters[0].stack_timeout = 60
        started = time.monotonic()
        assert within(10, lambda: send_bulk(batch, broker=broker, timeout=0.5)) == batch
        assert hung.closed.wait(5), "the hung node's connection was left open"
    assert time.monotonic() - started < 5
    assert rabbit.published == ids(batch) and hung.published == []
    assert recorder.enqueued == ids(batch) and recorder.unsent == []
    assert bulk_lines(caplog.records) == ["bulk_send_node_unreachable"]
    assert_no_traceback(caplog, capfd, pika_tracebacks)


@pytest.mark.parametrize("first", [{"acks": 2}, {"open_channel": False}], ids=["goes-silent", "no-channel"])
def test_a_node_that_opened_and_then_failed_is_not_passed_over(monkeypatch, recorder, first):
    """Once a node's connection opened, messages may have reached it: trying the next node would
    publish them twice. The send fails instead, naming the unconfirmed messages."""
    batch = messages(5)
    with fake_rabbitmq(**first) as failing, fake_rabbitmq() as other:
        broker = RabbitmqBroker(url=[failing.url(), other.url()], middleware=[recorder])
        monkeypatch.setattr(broker, "declare_queue", lambda queue_name, ensure=False: None)
        error = within(10, lambda: send_bulk(batch, broker=broker, timeout=0.5))
    assert isinstance(error, BulkSendError)
    assert other.published == []
    assert ids(error.failed) == ids(batch)[first.get("acks", 0) :]
