"""Opening a pika ``BlockingConnection`` so that every way it fails is an ``AMQPConnectionError``.

Callers take ``pika.exceptions.AMQPError`` (or ``AMQPConnectionError``) for "RabbitMQ
unreachable". But pika raises some connection failures as errors of its connector that are no
AMQPError: ``AMQPConnectorStackTimeout`` when a server accepts the TCP connection (or the TLS
set-up) and never completes the AMQP handshake within ``stack_timeout`` (a hung RabbitMQ, a port
that is not RabbitMQ's), ``socket.gaierror`` for a host name that does not resolve, ``ssl.SSLError``
for ``amqps`` to a port without TLS. They escaped as tracebacks naming the address. Here they become
AMQPConnectionErrors without the address in their text, so every caller's own "unreachable" applies.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pika
import pika.exceptions
from dramatiq.errors import ConnectionClosed
from pika.adapters.utils.connection_workflow import AMQPConnectorException, AMQPConnectorStackTimeout

__all__ = ["HandshakeTimeout", "connection_closed_on_failure", "connection_failures", "open_connection"]


class HandshakeTimeout(pika.exceptions.AMQPConnectionError):  # type: ignore[misc]  # untyped
    """A server took the connection but did not complete the AMQP handshake in time (pika's
    ``AMQPConnectorStackTimeout``): RabbitMQ hung, or something else listens on its port."""


def open_connection(parameters: Any) -> pika.BlockingConnection:
    """``pika.BlockingConnection(parameters)`` (one ``Parameters`` or a list of them, as pika takes);
    a failure to connect is an ``AMQPConnectionError`` (:class:`HandshakeTimeout` for a handshake
    that never finished), whose text names the error's class only, never the address."""
    with connection_failures():
        return pika.BlockingConnection(parameters)


@contextlib.contextmanager
def connection_failures() -> Iterator[None]:
    """Inside, pika's connector errors (and an OSError) are raised as AMQPConnectionErrors, as
    :func:`open_connection` says: for code that opens its connection through another's (Dramatiq's
    consumer)."""
    try:
        yield
    except AMQPConnectorStackTimeout:
        raise HandshakeTimeout("no AMQP handshake within the stack timeout") from None
    except (AMQPConnectorException, OSError) as exc:
        raise pika.exceptions.AMQPConnectionError(type(exc).__name__) from None


@contextlib.contextmanager
def connection_closed_on_failure() -> Iterator[None]:
    """Inside, a failure to connect is Dramatiq's ``ConnectionClosed``, on which its worker
    restarts a consumer (Dramatiq's consumer catches AMQPConnectionError only: a connector error
    was an "unexpected error", logged with a traceback naming the address)."""
    try:
        with connection_failures():
            yield
    except pika.exceptions.AMQPConnectionError as exc:
        raise ConnectionClosed(exc) from None  # type: ignore[no-untyped-call]
