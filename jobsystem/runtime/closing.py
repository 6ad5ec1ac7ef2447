"""Closing RabbitMQ connections within a bound: a peer that stopped answering holds up no shutdown.

pika's ``BlockingConnection.close()`` sends ``Connection.Close`` and waits for RabbitMQ's
``Close-Ok``; a channel's close waits for its own, and Dramatiq's consumer closes its channel and
connection so. When the peer is gone without the socket saying so (a node that hangs, a host
switched off, a network path that drops every packet), nothing answers: the close waited until the
connection's heartbeat gave up on it (minutes) or, with heartbeats off, for good, and a worker's
shutdown, the watchdog's round or a thread's release of its connection waited with it.

Each close here runs on a helper thread of its own (a daemon: it never holds the process up), all
of one call at once; the caller waits for them :data:`CLOSE_TIMEOUT_S` in all, then goes on. A
close still waiting is left to its thread and logged, ``connection_close_timed_out`` at WARNING,
naming what was closed by its class only (never the connection's address). The connection is no
one else's by then: each caller takes it from its owner before handing it here (a thread's
release from its state, the watchdog's round those of threads that ended, a broker's ``close()``
every thread's at once), so the owner's next use opens a new one. After such a close, the next ones wait
:data:`AFTER_SILENCE_S` at most, until one is answered in time again: a worker's shutdown closes
each consumer in turn, and a silent node would otherwise cost each of them the whole bound.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any

from jobsystem.privacy.outage_lines import log_outage

__all__ = [
    "AFTER_SILENCE_S",
    "CLOSE_TIMEOUT_S",
    "BoundedCloses",
    "Close",
    "close_quietly",
    "connection_closes",
]

logger = logging.getLogger(__name__)

#: How long a close is waited for (all the closes of one call together).
CLOSE_TIMEOUT_S = 5.0
#: How long a close is waited for after one was not answered, until one is again: a healthy
#: RabbitMQ answers a close within milliseconds.
AFTER_SILENCE_S = 0.5

#: What a close is about (named in the log by its class) and the call that closes it.
Close = tuple[object, Callable[[], None]]


class _Closing:
    """One close, running on a helper thread; what it raised, once it returned."""

    def __init__(self, what: object, close: Callable[[], None]) -> None:
        self.kind = type(what).__name__
        self.close = close
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=f"close-{self.kind}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.close()
        except BaseException as exc:  # handed to the caller that waits for it
            self.error = exc

    def done_by(self, deadline: float) -> bool:
        self.thread.join(max(0.0, deadline - time.monotonic()))
        return not self.thread.is_alive()


class BoundedCloses:
    """The closes of one broker's connections, each waited for a bounded time (see the module
    docstring). ``timeout`` and ``after_silence``: :data:`CLOSE_TIMEOUT_S`, :data:`AFTER_SILENCE_S`."""

    def __init__(self, timeout: float = CLOSE_TIMEOUT_S, after_silence: float = AFTER_SILENCE_S) -> None:
        self.timeout = timeout
        self.after_silence = after_silence
        #: A close was not answered in time, and none was since.
        self.silent = False

    def run(self, closes: Sequence[Close]) -> None:
        """Run each close at once, on a helper thread of its own; return when all returned, or
        once the bound passed (those still waiting are logged). Raises the first error a close
        that returned raised."""
        if not closes:
            return
        waited = self.after_silence if self.silent else self.timeout
        deadline = time.monotonic() + waited
        running = [_Closing(what, close) for what, close in closes]
        late = [closing for closing in running if not closing.done_by(deadline)]
        self.silent = bool(late)
        for closing in late:
            logger.warning("connection_close_timed_out", extra={"kind": closing.kind, "waited_s": waited})
        error = next((c.error for c in running if c not in late and c.error is not None), None)
        if error is not None:
            raise error


def close_quietly(*opened: Any) -> None:
    """Close pika channels and connections, in order, any of them closed already (by RabbitMQ, by
    a broker's ``close()``); a failure is logged by class (``broker_connection_close_failed``)."""
    for item in opened:
        if not item.is_open:
            continue
        try:
            item.close()
        except Exception as exc:  # a connection RabbitMQ dropped; nothing more to release
            kind = type(item).__name__
            log_outage(logger, logging.WARNING, "broker_connection_close_failed", exc, kind=kind)


def connection_closes(connections: Iterable[Any], channels: Iterable[Any] = ()) -> list[Close]:
    """A close for each open connection of ``connections``, its channels of ``channels`` first:
    pika's objects are not for two threads at once, so a connection and its channels are closed
    by one helper thread, in order."""
    channels = list(channels)
    return [
        (connection, partial(close_quietly, *[c for c in channels if c.connection is connection], connection))
        for connection in connections
        if connection is not None and connection.is_open
    ]
