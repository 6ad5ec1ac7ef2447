"""A running demo's sign of life: an exclusive queue ``<prefix>.alive`` on a connection it holds
for its whole run.

A demo killed with SIGKILL (the OOM killer, ``kill -9``) deletes nothing: its queues, its delay
cascade's exchanges and its state keys stayed for ever. The next demo removes them, but two demos
may run at once on one vhost, and only a dead one's may go. RabbitMQ deletes an exclusive queue
when its connection closes, and the kernel closes a process's sockets however it dies: a prefix
without its alive queue belongs to a dead demo. The demo declares it before anything else under
its prefix, so a live demo's queues or keys are never seen without it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["ALIVE_SUFFIX", "AliveQueue", "alive_queue", "dead_prefixes"]

#: The alive queue's name after the demo's prefix (a dot: no work queue's name has one first).
ALIVE_SUFFIX = ".alive"

#: AMQP replies to a passive declare: no such queue; exclusive to another connection.
NOT_FOUND, RESOURCE_LOCKED = 404, 405


def alive_queue(prefix: str) -> str:
    return f"{prefix}{ALIVE_SUFFIX}"


class AliveQueue:
    """Holds ``<prefix>.alive`` in a thread of its own, which serves the connection's heartbeats
    (an unserved connection is closed by RabbitMQ after two missed heartbeats, and the live demo
    would look dead) and which Ctrl-C, delivered to the main thread, never interrupts mid-call."""

    def __init__(self, url: str, prefix: str) -> None:
        self.url, self.name = url, alive_queue(prefix)
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._hold, name="demo-alive", daemon=True)

    def start(self, timeout: float = 30.0) -> None:
        """Declare the queue; returns once it exists, raises if it could not be declared."""
        self._thread.start()
        if not self._ready.wait(timeout):
            self._stop.set()
            raise TimeoutError(f"the alive queue was not declared within {timeout:g} s")
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """Close the connection: RabbitMQ deletes the queue. Call it last, once the demo's own
        queues and keys are gone (until then a concurrent sweep must see it alive)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)

    def _hold(self) -> None:
        """Connect and declare, then serve the connection until :meth:`close`; a lost connection
        (a RabbitMQ restart) is opened again and the queue declared again."""
        import pika

        first = True
        while not self._stop.is_set():
            connection: Any = None
            try:
                connection = pika.BlockingConnection(pika.URLParameters(self.url))
                connection.channel().queue_declare(self.name, exclusive=True)
                self._ready.set()
                first = False
                while not self._stop.is_set():
                    connection.process_data_events(time_limit=0.5)
            except Exception as exc:
                if first:
                    self._error = exc
                    self._ready.set()
                    return
                self._stop.wait(1.0)
            finally:
                if connection is not None:
                    with contextlib.suppress(Exception):
                        connection.close()


def dead_prefixes(url: str, prefixes: list[str]) -> list[str]:
    """The ``prefixes`` whose alive queue does not exist (passive declares, a channel each: a
    refused one is closed). One held by another connection answers RESOURCE_LOCKED: alive; so is
    one that exists, and any other answer leaves the prefix alone."""
    import pika
    from pika.exceptions import ChannelClosedByBroker

    dead = []
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        with _quiet(logging.getLogger("pika.channel")):  # it warns of each refusal: the answers here
            for prefix in prefixes:
                channel = connection.channel()
                try:
                    channel.queue_declare(alive_queue(prefix), passive=True)
                except ChannelClosedByBroker as exc:
                    if exc.reply_code == NOT_FOUND:
                        dead.append(prefix)
                    continue
                channel.close()
    finally:
        connection.close()
    return dead


@contextlib.contextmanager
def _quiet(logger: logging.Logger) -> Iterator[None]:
    """``logger`` logs errors only, for the duration."""
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
