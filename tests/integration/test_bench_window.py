"""The bench's clock starts only once the worker group has booted: every worker process consumes
the queue and, where the row serves one, the ``/metrics`` process answers; a group that does not
boot or exits stops the run with the reason."""

from __future__ import annotations

import http.server
import subprocess
import threading
import uuid
from collections.abc import Iterator

import pika
import pytest
from dramatiq.brokers.rabbitmq import RabbitmqBroker

from bench import throughput
from bench.ports import free_port
from bench.throughput import Run, _answers, _wait_for_boot

URL = "amqp://guest:guest@127.0.0.1:5672/%2F"


@pytest.fixture
def queue() -> Iterator[tuple[RabbitmqBroker, str]]:
    broker = RabbitmqBroker(url=URL)
    name = f"bench-{uuid.uuid4().hex[:8]}"
    broker.channel.queue_declare(name, durable=True)
    try:
        yield broker, name
    finally:
        broker.channel.queue_delete(name)
        broker.close()


@pytest.fixture
def idle_worker() -> Iterator[subprocess.Popen[bytes]]:
    """A process that stays up and consumes nothing: the consumers are the test's."""
    process = subprocess.Popen(["sleep", "30"])
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def _consumer(queue: str) -> pika.BlockingConnection:
    """A consumer that takes one message and keeps it unacked, as a booted worker process does."""
    connection = pika.BlockingConnection(pika.URLParameters(URL))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=1)
    channel.basic_consume(queue, lambda *args: None)
    return connection


def test_the_clock_starts_once_every_worker_process_consumes(queue, idle_worker, monkeypatch):
    broker, name = queue
    for i in range(5):
        broker.channel.basic_publish("", name, f"m{i}".encode())
    run = Run(count=5, processes=2, threads=1)
    monkeypatch.setattr(throughput, "BOOT_TIMEOUT_S", 0.5)
    first = _consumer(name)
    try:
        with pytest.raises(RuntimeError, match="did not boot within"):
            _wait_for_boot("row", idle_worker, broker, name, run, "0")  # one process of two
        second = _consumer(name)
        try:
            assert _wait_for_boot("row", idle_worker, broker, name, run, "0") == 3  # each took one
        finally:
            second.close()
    finally:
        first.close()


def test_metrics_count_as_up_once_they_answer_even_with_an_error():
    port = free_port()
    assert not _answers(str(port))  # nothing listens there yet
    server = http.server.HTTPServer(("127.0.0.1", port), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert _answers(str(port))  # a 501 is an answer
    finally:
        server.shutdown()
        server.server_close()


def test_a_group_that_exits_stops_the_run_with_the_reason(queue):
    broker, name = queue
    exited = subprocess.Popen(["true"])
    exited.wait()
    with pytest.raises(RuntimeError, match="exited with 0"):
        _wait_for_boot("row", exited, broker, name, Run(count=10, processes=1, threads=1), "0")
