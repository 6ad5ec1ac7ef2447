"""A running demo's sign of life: an exclusive queue ``<prefix>.alive`` on a connection it holds
for its whole run.

A demo killed with SIGKILL (the OOM killer, ``kill -9``) deletes nothing: its queues, its delay
cascade's exchanges and its state keys stayed for ever. The next demo removes them, but two demos
may run at once on one vhost, and only a dead one's may go. RabbitMQ deletes an exclusive queue
when its connection closes, and the kernel closes a process's sockets however it dies: a prefix
without its alive queue may belong to a dead demo. The demo declares it before anything else under
its prefix, so a live demo's queues or keys are never seen without it.

A live demo's alive queue is gone too while its connection is down: a RabbitMQ restart, a network
blip, or the demo paused (Ctrl-Z, SIGSTOP, a laptop asleep) past two missed heartbeats, when
RabbitMQ closes the connection and the queue stays gone for the whole pause. So a prefix is dead
(:func:`dead_prefixes`) only when (a) its alive queue is absent, (b) no queue under it has a
consumer (a live demo's worker consumes its queues; the worker is a child in a session of its own,
so a paused demo's worker goes on consuming, and :mod:`demo.orphan_guard` stops a killed demo's),
and (c) both still hold on a second look :data:`SECOND_LOOK_S` later, longer than this thread
takes to reconnect (a RabbitMQ restart drops consumers and alive queues together; both come back
as the demo reconnects). The second look is paid only when the first finds a dead-looking prefix.
A killed demo's worker still finishing its jobs keeps the prefix for a later sweep; so does, on
a system without a parent-death signal, a worker that outlived its demo (its queues are in use).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

__all__ = ["ALIVE_SUFFIX", "SECOND_LOOK_S", "AliveQueue", "alive_queue", "dead_prefixes", "retry_delays"]

#: The alive queue's name after the demo's prefix (a dot: no work queue's name has one first).
ALIVE_SUFFIX = ".alive"

#: AMQP replies to a passive declare: no such queue; exclusive to another connection.
NOT_FOUND, RESOURCE_LOCKED = 404, 405

#: After a lost connection the alive thread tries again at once, then waits this long, doubling up
#: to the cap: a RabbitMQ restart is not hammered, and the queue is back within the cap (plus the
#: connection's opening) of RabbitMQ being back.
FIRST_RETRY_S, MAX_RETRY_S = 0.1, 1.0

#: A connection held this long was steady: the next loss starts the waits afresh (one that fails
#: as soon as it is open keeps backing off rather than reconnecting at once each time).
STEADY_S = 10.0

#: The wait before the second look: longer than the alive thread's reconnect (the cap, plus up to
#: 2 s to open a connection), a few seconds paid only when the first look finds a dead-looking one.
SECOND_LOOK_S = MAX_RETRY_S + 2.0


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

        from jobsystem.runtime.connecting import open_connection

        first, delays, held = True, retry_delays(), 0.0
        while not self._stop.is_set():
            connection: Any = None
            try:
                connection = open_connection(pika.URLParameters(self.url))
                connection.channel().queue_declare(self.name, exclusive=True)
                self._ready.set()
                first, held = False, time.monotonic()
                while not self._stop.is_set():
                    connection.process_data_events(time_limit=0.5)
            except Exception as exc:
                if first:
                    self._error = exc
                    self._ready.set()
                    return
                if held and time.monotonic() - held > STEADY_S:
                    delays = retry_delays()
                held = 0.0
                self._stop.wait(next(delays))
            finally:
                if connection is not None:
                    with contextlib.suppress(Exception):
                        connection.close()


def retry_delays() -> Iterator[float]:
    """The waits before each new attempt after a lost connection: none, then growing to the cap."""
    yield 0.0
    delay = FIRST_RETRY_S
    while True:
        yield delay
        delay = min(delay * 2, MAX_RETRY_S)


def dead_prefixes(url: str, queues: Mapping[str, Iterable[str]]) -> list[str]:
    """The prefixes (the keys of ``queues``, each with its queues' names) whose demo is dead: no
    sign of life now, nor :data:`SECOND_LOOK_S` later (see the module's docstring)."""
    silent = _silent(url, queues)
    if not silent:
        return []
    time.sleep(SECOND_LOOK_S)
    return _silent(url, {prefix: queues[prefix] for prefix in silent})


def _silent(url: str, queues: Mapping[str, Iterable[str]]) -> list[str]:
    """The prefixes without a sign of life now: their alive queue absent, no consumer on any of
    their queues (passive declares, after the names were listed)."""
    import pika

    from jobsystem.runtime.connecting import open_connection

    connection = open_connection(pika.URLParameters(url))
    try:
        with _quiet(logging.getLogger("pika.channel")):  # it warns of each refusal: the answers here
            return [
                prefix
                for prefix, names in queues.items()
                if not _alive(connection, alive_queue(prefix), only_held=False)
                and not any(_alive(connection, name, only_held=True) for name in names)
            ]
    finally:
        connection.close()


def _alive(connection: Any, name: str, *, only_held: bool) -> bool:
    """Whether the queue ``name`` shows life: held by another connection (RESOURCE_LOCKED), with a
    consumer, or (unless ``only_held``) there at all. Absent is no sign; any other refusal is taken
    for one (a channel each: a refused one is closed)."""
    from pika.exceptions import ChannelClosedByBroker

    channel = connection.channel()
    try:
        declared = channel.queue_declare(name, passive=True)
    except ChannelClosedByBroker as exc:
        return bool(exc.reply_code != NOT_FOUND)
    channel.close()
    return not only_held or int(declared.method.consumer_count) > 0


@contextlib.contextmanager
def _quiet(logger: logging.Logger) -> Iterator[None]:
    """``logger`` logs errors only, for the duration."""
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
