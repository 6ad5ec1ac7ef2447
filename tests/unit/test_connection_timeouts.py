"""A RabbitMQ that accepts the TCP connection and never answers, for every caller that opens a pika
``BlockingConnection``: pika's handshake timeout (``AMQPConnectorStackTimeout``, no AMQPError) is
each caller's usual "unreachable", never a traceback naming the address or the password."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pika.exceptions
import pytest
from dramatiq import Message
from dramatiq.errors import ConnectionClosed

from jobsystem.runtime.connecting import HandshakeTimeout, open_connection
from jobsystem.settings import load_settings
from tests.servers import silent_server
from tests.support import BIN, ROOT, finished_within

#: The handshake's timeout in these tests (pika's own is 15 s), and the bound a call must keep:
#: a few handshakes, plus time for a busy machine.
STACK_TIMEOUT = 0.5
BOUND = 10.0

PASSWORD = f"pw-{uuid.uuid4().hex}"


@pytest.fixture
def silent_url() -> Iterator[str]:
    """A RabbitMQ URL whose server accepts and never answers: one attempt, a short handshake."""
    with silent_server() as port:
        yield (
            f"amqp://guest:{PASSWORD}@127.0.0.1:{port}/%2F"
            f"?stack_timeout={STACK_TIMEOUT}&connection_attempts=1"
        )


def test_open_connection_makes_the_handshake_timeout_an_amqp_connection_error(silent_url: str):
    with pytest.raises(HandshakeTimeout) as raised:
        finished_within(BOUND, lambda: open_connection(pika.URLParameters(silent_url)))
    assert isinstance(raised.value, pika.exceptions.AMQPConnectionError)
    assert "127.0.0.1" not in str(raised.value) and raised.value.__cause__ is None


def test_open_connection_makes_a_name_that_does_not_resolve_an_amqp_connection_error():
    """pika raises ``socket.gaierror`` (an OSError) for it, past every ``except AMQPError``."""
    parameters = pika.URLParameters("amqp://guest:guest@no-such-host.invalid:5672/%2F?connection_attempts=1")
    with pytest.raises(pika.exceptions.AMQPConnectionError, match="gaierror"):
        open_connection(parameters)


def jobctl(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``jobctl args`` against ``url``, its management API refusing connections."""
    env = {**os.environ, "RABBITMQ_URL": url, "RABBITMQ_MANAGEMENT_URL": "http://127.0.0.1:1"}
    command = [str(BIN / "jobctl"), *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def assert_unreachable(done: subprocess.CompletedProcess[str], line: str) -> None:
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert line in output, output
    assert "Traceback" not in output and PASSWORD not in output, output


def test_jobctl_ping_says_unreachable_within_its_timeout(silent_url: str):
    """``--timeout`` bounds the whole handshake (it waited pika's 15 s, then a traceback)."""
    url = silent_url.split("?")[0]  # ping's own --timeout, not the URL's
    done = finished_within(BOUND, lambda: jobctl(url, "ping", "--timeout", str(STACK_TIMEOUT)))
    assert_unreachable(done, "rabbitmq    unreachable  amqp://guest:***@127.0.0.1")
    assert "(HandshakeTimeout)" in done.stdout


def test_jobctl_dlq_list_says_rabbitmq_unreachable(silent_url: str):
    done = jobctl(silent_url, "dlq", "list")
    assert_unreachable(done, "jobctl: RabbitMQ unreachable (HandshakeTimeout)")


def silent_broker(url: str) -> Any:
    from jobsystem.rabbitmq.broker import build_broker

    return build_broker(load_settings({"RABBITMQ_URL": url}), [])


def test_the_dead_letter_reader_raises_an_amqp_connection_error(silent_url: str):
    from jobsystem.ops.dead_letter_reader import Reader

    with pytest.raises(HandshakeTimeout):
        finished_within(BOUND, lambda: Reader(silent_broker(silent_url)))


def test_a_migration_raises_an_amqp_connection_error(silent_url: str, monkeypatch: pytest.MonkeyPatch):
    """What ``jobctl migrate-queues`` calls once the management API listed the queues."""
    from jobsystem.ops import migration

    monkeypatch.setattr(migration, "is_work_queue", lambda settings, name: True)
    monkeypatch.setattr(migration, "foreign_queues", lambda broker, names: [])
    monkeypatch.setattr(migration, "existing_queues", lambda settings: {})
    broker = silent_broker(silent_url)
    with pytest.raises(HandshakeTimeout):
        finished_within(BOUND, lambda: migration.migrate(broker, broker_settings(silent_url), ["q"]))


def broker_settings(url: str) -> Any:
    return load_settings({"RABBITMQ_URL": url})


def test_a_send_to_a_silent_rabbitmq_is_dramatiqs_connection_closed(silent_url: str):
    """The broker's publishing connection: its attempts run, then the caller gets Dramatiq's
    ConnectionClosed as for any lost RabbitMQ (the raw connector error skipped the attempts)."""
    broker = silent_broker(silent_url)
    message: Message[Any] = Message("q", "job", (), {}, {})
    with pytest.raises(ConnectionClosed) as raised:
        finished_within(BOUND, lambda: broker.enqueue(message))
    assert PASSWORD not in str(raised.value)


def test_a_consumer_of_a_silent_rabbitmq_is_dramatiqs_connection_closed(silent_url: str):
    """The worker then says "connection error" and restarts the consumer, where a raw connector
    error was an "unexpected error" logged with a traceback naming the address."""
    from jobsystem.rabbitmq.consumer import DeadLetteringConsumer

    broker = silent_broker(silent_url)
    with pytest.raises(ConnectionClosed) as raised:
        finished_within(BOUND, lambda: DeadLetteringConsumer(broker, "q", 1, 1_000))
    assert "127.0.0.1" not in str(raised.value)


def test_the_demo_says_rabbitmq_did_not_answer(silent_url: str):
    """The demo's first connection (its alive queue) gets the demo's fixed line, not a traceback."""
    from demo.alive import AliveQueue
    from demo.services import RABBITMQ_SILENT, error_line

    alive = AliveQueue(silent_url, f"demo-{uuid.uuid4().hex[:6]}-")
    with pytest.raises(pika.exceptions.AMQPError) as raised:
        finished_within(BOUND, lambda: alive.start(timeout=BOUND))
    assert error_line(broker_settings(silent_url), raised.value) == RABBITMQ_SILENT


def test_the_demo_sweep_look_raises_an_amqp_connection_error(silent_url: str):
    from demo.alive import dead_prefixes

    with pytest.raises(HandshakeTimeout):
        finished_within(BOUND, lambda: dead_prefixes(silent_url, {"demo-x-": ["demo-x-q"]}))
