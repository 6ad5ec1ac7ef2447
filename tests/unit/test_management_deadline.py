"""Management API calls under one deadline: a server that accepts and then trickles its answer (a
byte now and then, each well inside requests' per-read timeout) held the caller until it was
done, however long that took; the call must give up at its deadline, whatever it was reading."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from jobsystem.ops.management import ManagementTimeout, oldest_age_s, queue_names, queue_stats
from jobsystem.settings import Settings
from tests.support import wait_for, within

DEADLINE_S = 1.5
#: A byte this often: far inside the per-read timeout, so only a total deadline stops the call.
EVERY_S = 0.2
BODY = json.dumps([{"name": f"queue-{i}", "messages_ready": 0} for i in range(10)]).encode()


@dataclass
class Trickle:
    """What the trickling server saw: connections it answered in full, and cut short."""

    port: int = 0
    finished: int = 0
    cut_short: int = 0
    first_byte: threading.Event = field(default_factory=threading.Event)


def _answer(connection: socket.socket, trickle: Trickle, phase: str) -> None:
    with connection:
        request = b""
        while b"\r\n\r\n" not in request:
            chunk = connection.recv(65536)
            if not chunk:
                return
            request += chunk
        head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(BODY)}\r\n\r\n"
        fast, slow = (b"", head.encode() + BODY) if phase == "headers" else (head.encode(), BODY)
        if phase == "none":
            fast, slow = head.encode() + BODY, b""
        try:
            connection.sendall(fast)
            for i in range(len(slow)):
                connection.sendall(slow[i : i + 1])
                trickle.first_byte.set()
                time.sleep(EVERY_S)
        except OSError:  # the client hung up
            trickle.cut_short += 1
            return
        trickle.finished += 1


@contextlib.contextmanager
def serving(handler: Callable[[socket.socket, Trickle], None]) -> Iterator[Trickle]:
    """A local server running ``handler`` on each connection, in a thread of its own."""
    listener = socket.create_server(("127.0.0.1", 0))
    trickle = Trickle(port=listener.getsockname()[1])

    def serve() -> None:
        with contextlib.suppress(OSError):  # the listener closed
            while True:
                connection = listener.accept()[0]
                threading.Thread(target=handler, args=(connection, trickle), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield trickle
    finally:
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)
        listener.close()


def trickling_server(phase: str) -> contextlib.AbstractContextManager[Trickle]:
    """An HTTP server answering every request with 200 and a JSON list, its ``phase`` ("headers",
    "body": from the status line or after the headers; "none": at once) sent a byte at a time."""
    return serving(lambda connection, trickle: _answer(connection, trickle, phase))


def _settings(port: int) -> Settings:
    return Settings(
        rabbitmq_management_url=f"http://127.0.0.1:{port}", rabbitmq_url="amqp://guest:guest@127.0.0.1:1/%2F"
    )


@pytest.mark.parametrize("phase", ["headers", "body"])
@pytest.mark.parametrize(
    "call",
    [queue_stats, queue_names, lambda config, timeout: oldest_age_s(config, "q", timeout)],
    ids=["queue_stats", "queue_names", "oldest_age_s"],
)
def test_a_management_api_that_trickles_its_answer_is_given_up_at_the_deadline(phase, call):
    with trickling_server(phase) as trickle:
        outcome = within(DEADLINE_S + 5, lambda: call(_settings(trickle.port), DEADLINE_S))
        assert isinstance(outcome, ManagementTimeout), outcome
        assert trickle.first_byte.is_set() and trickle.finished == 0  # it was still sending


def test_a_management_api_that_answers_at_once_is_read_as_before():
    with trickling_server("none") as trickle:
        assert queue_names(_settings(trickle.port), DEADLINE_S) == [f"queue-{i}" for i in range(10)]
        wait_for(
            lambda: trickle.finished == 1, what="the server to count its answer sent"
        )  # after the client read it
