"""The bench's clock starts only once the worker group has booted: every worker process consumes
the queue and, where the row serves one, the ``/metrics`` process answers."""

from __future__ import annotations

import http.server
import socket
import subprocess
import threading
import uuid
from collections.abc import Iterator

import pika
import pytest
from dramatiq.brokers.rabbitmq import RabbitmqBroker

from bench import throughput
from bench.throughput import Run, _booted

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


def _consumer(queue: str) -> pika.BlockingConnection:
    connection = pika.BlockingConnection(pika.URLParameters(URL))
    connection.channel().basic_consume(queue, lambda *args: None)
    return connection


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_booted_once_every_worker_process_consumes(queue):
    broker, name = queue
    first = _consumer(name)
    try:
        assert not _booted(broker, name, 2, "0")
        second = _consumer(name)
        try:
            assert _booted(broker, name, 2, "0")
        finally:
            second.close()
    finally:
        first.close()


def test_booted_only_once_the_metrics_process_answers(queue):
    broker, name = queue
    port = _free_port()
    consumer = _consumer(name)
    try:
        assert not _booted(broker, name, 1, str(port))  # nothing listens there yet
        server = http.server.HTTPServer(("127.0.0.1", port), http.server.BaseHTTPRequestHandler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            assert _booted(broker, name, 1, str(port))  # an answer, even an error, is an answer
        finally:
            server.shutdown()
            server.server_close()
    finally:
        consumer.close()


def test_a_group_that_does_not_boot_or_exits_stops_the_run_with_the_reason(queue, monkeypatch):
    broker, name = queue
    run = Run(count=10, processes=1, threads=1)
    monkeypatch.setattr(throughput, "BOOT_TIMEOUT_S", 0.3)
    stuck = subprocess.Popen(["sleep", "30"])  # never consumes
    try:
        with pytest.raises(RuntimeError, match="did not boot within"):
            throughput._wait_for_boot("row", stuck, broker, name, run, "0")
    finally:
        stuck.kill()
        stuck.wait()
    exited = subprocess.Popen(["true"])
    exited.wait()
    with pytest.raises(RuntimeError, match="exited with 0"):
        throughput._wait_for_boot("row", exited, broker, name, run, "0")
