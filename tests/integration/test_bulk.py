"""Bulk send: confirmed means in the queue; a nack names the messages that did not make it."""

from __future__ import annotations

import time
from typing import Any

import dramatiq
import pika
import pika.frame
import pytest

from jobsystem.rabbitmq.bulk import BulkSendError, send_bulk
from jobsystem.rabbitmq.bulk_publisher import Publisher
from tests import workload
from tests.amqp_server import fake_rabbitmq, silenceable_path
from tests.servers import free_port
from tests.support import within


class Enqueued(dramatiq.Middleware):
    """Notes the message id of each ``after_enqueue``."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    def after_enqueue(self, broker: dramatiq.Broker, message: dramatiq.Message[Any], delay: Any) -> None:
        self.ids.append(message.message_id)


def test_nacked_messages_are_named_and_the_confirmed_ones_enqueued(queues, monkeypatch):
    queue = queues.name(workload.record)
    queues.broker.declare_queue(queue, ensure=True)
    enqueued = Enqueued()
    monkeypatch.setattr(queues.broker, "middleware", [*queues.broker.middleware, enqueued])
    messages = [queues.message(workload.record, f"c{i}") for i in range(20)]
    with queues.capped(queue, 5), pytest.raises(BulkSendError) as caught:
        send_bulk(messages, broker=queues.broker)
    error = caught.value
    assert len(error.confirmed) == 5 and len(error.failed) == 15
    assert {m.message_id for m in error.failed} == {m.message_id for m in messages[5:]}
    assert queues.depth(queue) == 5
    assert "15 of 20 messages not confirmed" in str(error)
    # The confirmed ones had their after_enqueue hooks (job status "queued", the lifecycle log).
    assert enqueued.ids == [m.message_id for m in messages[:5]]


def test_the_timeout_is_the_longest_wait_for_a_confirm_not_a_deadline(queues, monkeypatch):
    """One confirm at a time, each handled 50 ms late: the batch takes over a second, twice the
    timeout, and goes through, for each wait for the next confirm is far shorter."""
    on_confirm = Publisher._on_confirm

    def slow(publisher: Publisher, frame: pika.frame.Method) -> None:
        time.sleep(0.05)
        on_confirm(publisher, frame)

    monkeypatch.setattr(Publisher, "_on_confirm", slow)
    queue = queues.name(workload.record)
    messages = [queues.message(workload.record, f"t{i}") for i in range(20)]
    started = time.monotonic()
    assert len(send_bulk(messages, broker=queues.broker, window=1, timeout=0.5)) == 20
    assert time.monotonic() - started > 1.0
    assert queues.depth(queue) == 20


def test_a_send_that_hears_no_confirm_fails_after_the_timeout(queues, monkeypatch):
    monkeypatch.setattr(Publisher, "_on_confirm", lambda publisher, frame: None)
    messages = [queues.message(workload.record, f"s{i}") for i in range(5)]
    with pytest.raises(BulkSendError, match=r"no confirm within 0\.3 s") as caught:
        send_bulk(messages, broker=queues.broker, timeout=0.3)
    assert len(caught.value.failed) == 5


@pytest.mark.parametrize("where", ["frame", "timer"])
def test_an_error_in_a_publisher_callback_fails_the_send_and_closes_its_connection(
    queues, monkeypatch, caplog, where
):
    """pika turns an error in a frame's callback into a lost connection, and lets one in a timer's
    out of its loop: either way the send fails naming the error, its connection closed, and no
    message's arguments reach the logs."""
    connections: list[pika.SelectConnection] = []

    def broken(publisher: Publisher, *args: Any) -> None:
        assert publisher.connection is not None
        connections.append(publisher.connection)
        raise RuntimeError("a bug in a callback")

    if where == "timer":
        monkeypatch.setattr(Publisher, "_on_confirm", lambda publisher, frame: None)
    monkeypatch.setattr(Publisher, "_on_timeout" if where == "timer" else "_on_confirm", broken)
    messages = [queues.message(workload.record, f"private-{i}") for i in range(20)]
    with pytest.raises(BulkSendError, match=r"RuntimeError.*a bug in a callback") as caught:
        send_bulk(messages, broker=queues.broker, timeout=0.2 if where == "timer" else 120.0)
    assert len(caught.value.failed) == 20
    assert connections and connections[0].is_closed
    assert "private-" not in caplog.text


def test_a_node_that_cannot_be_reached_is_passed_over(queues, monkeypatch):
    broker = queues.broker
    nodes = broker.parameters if isinstance(broker.parameters, list) else [broker.parameters]
    closed = pika.ConnectionParameters(host="127.0.0.1", port=free_port(), connection_attempts=1)
    monkeypatch.setattr(broker, "parameters", [closed, *nodes])
    queue = queues.name(workload.record)
    messages = [queues.message(workload.record, f"n{i}") for i in range(20)]
    assert len(send_bulk(messages, broker=broker)) == 20
    assert queues.depth(queue) == 20


def test_a_node_that_hangs_while_opening_past_the_timeout_is_passed_over(queues, monkeypatch):
    """A node that accepts TCP and never speaks AMQP, its ``stack_timeout`` longer than the send's
    ``timeout``: the timeout gives it up, and the messages go to the real node after it."""
    broker = queues.broker
    nodes = broker.parameters if isinstance(broker.parameters, list) else [broker.parameters]
    queue = queues.name(workload.record)
    broker.declare_queue(queue, ensure=True)  # now, on the broker's own connection to the real node
    messages = [queues.message(workload.record, f"h{i}") for i in range(20)]
    with fake_rabbitmq(speak=False) as hung:
        silent = pika.URLParameters(hung.url())
        silent.stack_timeout = 60
        monkeypatch.setattr(broker, "parameters", [silent, *nodes])
        assert within(15, lambda: send_bulk(messages, broker=broker, timeout=2.0)) == messages
        assert hung.closed.wait(5), "the hung node's connection was left open"
    assert queues.depth(queue) == 20


def test_a_send_returns_when_the_path_to_rabbitmq_goes_silent_at_the_close(queues, monkeypatch):
    """Every message confirmed, then the network path swallows every byte, the close included (pika
    would wait for its answer forever): the send returns them all, its socket closed."""
    broker = queues.broker
    queue = queues.name(workload.record)
    broker.declare_queue(queue, ensure=True)  # now, on the broker's own connection, not the path
    node = broker.parameters[0] if isinstance(broker.parameters, list) else broker.parameters
    with silenceable_path(node.host, node.port) as path:
        proxied = pika.ConnectionParameters(
            "127.0.0.1", path.port, node.virtual_host, node.credentials, connection_attempts=1
        )
        monkeypatch.setattr(broker, "parameters", [proxied])
        on_confirm = Publisher._on_confirm

        def silenced(publisher: Publisher, frame: pika.frame.Method) -> None:
            if (
                publisher.next_index == len(publisher.messages)
                and frame.method.delivery_tag == publisher.published
            ):
                path.silent.set()  # the last confirm: what the send writes next is its close
            on_confirm(publisher, frame)

        monkeypatch.setattr(Publisher, "_on_confirm", silenced)
        messages = [queues.message(workload.record, f"p{i}") for i in range(20)]
        assert within(15, lambda: send_bulk(messages, broker=broker, timeout=1.0)) == messages
        assert path.closed.wait(5), "the connection was left open"
    assert queues.depth(queue) == 20
