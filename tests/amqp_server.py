"""A RabbitMQ that goes silent, for tests: a stand-in speaking just enough AMQP 0-9-1 for a
publisher with confirms (the handshake, one channel in confirm mode, publishes, the closes), for
a consumer's prefetch (``Basic.Qos``) and for passive declares, whose answers a test can
withhold; and a TCP proxy in front of the real one, which a test can make swallow every byte (a
network path gone silent)."""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pika
import pika.frame
import pika.spec

__all__ = ["FakeRabbit", "SilentPath", "fake_rabbitmq", "silenceable_path"]

#: What RabbitMQ announces; pika refuses confirm mode without the first two.
_CAPABILITIES = {"publisher_confirms": True, "basic.nack": True, "connection.blocked": True}


@dataclass
class FakeRabbit:
    """What the server answers, and what it saw."""

    #: False: accept the TCP connection and never say a word (a node that hangs while opening).
    speak: bool = True
    #: False: never answer Channel.Open.
    open_channel: bool = True
    #: Ack only this many publishes (each on its own), then none; None: all of them.
    acks: int | None = None
    #: False: never answer Channel.Close or Connection.Close.
    answer_close: bool = True
    #: True: answer a (passive) Queue.Declare, every queue there and empty; False: never answer it.
    declare: bool = False
    port: int = 0
    #: The message id of each publish, in order.
    published: list[str] = field(default_factory=list)
    #: Set when a client's socket closed (the server read its end).
    closed: threading.Event = field(default_factory=threading.Event)

    def url(self) -> str:
        """An AMQP URL of this server: one connection attempt, no heartbeat."""
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F?connection_attempts=1&heartbeat=0"

    def answer(self, frame: Any) -> list[pika.frame.Frame]:
        """The frames to send back for ``frame``, one the client sent."""
        if not self.speak:
            return []
        if isinstance(frame, pika.frame.ProtocolHeader):
            start = pika.spec.Connection.Start(server_properties={"capabilities": _CAPABILITIES})
            return [pika.frame.Method(0, start)]
        if isinstance(frame, pika.frame.Header):
            self.published.append(frame.properties.message_id)
            tag = len(self.published)
            acked = self.acks is None or tag <= self.acks
            return [pika.frame.Method(frame.channel_number, pika.spec.Basic.Ack(tag))] if acked else []
        if not isinstance(frame, pika.frame.Method):
            return []  # a body, a heartbeat
        reply = self._reply(frame.method)
        return [] if reply is None else [pika.frame.Method(frame.channel_number, reply)]

    def _reply(self, method: Any) -> Any:
        if isinstance(method, pika.spec.Queue.Declare):
            return pika.spec.Queue.DeclareOk(method.queue, 0, 0) if self.declare else None
        closes = self.answer_close
        replies = {
            pika.spec.Connection.StartOk: pika.spec.Connection.Tune(2047, 131072, 0),
            pika.spec.Connection.Open: pika.spec.Connection.OpenOk(),
            pika.spec.Channel.Open: pika.spec.Channel.OpenOk() if self.open_channel else None,
            pika.spec.Confirm.Select: pika.spec.Confirm.SelectOk(),
            pika.spec.Basic.Qos: pika.spec.Basic.QosOk(),
            pika.spec.Channel.Close: pika.spec.Channel.CloseOk() if closes else None,
            pika.spec.Connection.Close: pika.spec.Connection.CloseOk() if closes else None,
        }
        return replies.get(type(method))


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        rabbit, client = self.server.rabbit, self.request
        self.server.clients.append(client)
        buffer = b""
        try:
            while data := client.recv(65536):
                buffer += data
                while True:
                    used, frame = pika.frame.decode_frame(buffer)
                    if frame is None:
                        break
                    buffer = buffer[used:]
                    for reply in rabbit.answer(frame):
                        client.sendall(reply.marshal())
        except OSError:
            pass
        finally:
            rabbit.closed.set()


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, rabbit: FakeRabbit) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.rabbit = rabbit
        self.clients: list[socket.socket] = []


@contextlib.contextmanager
def fake_rabbitmq(**behaviour: Any) -> Iterator[FakeRabbit]:
    """A :class:`FakeRabbit` (``behaviour``: its fields) listening on a free local port. When the
    block ends, the clients' sockets are shut down: a client the test left waiting sees the end of
    its stream and returns."""
    rabbit = FakeRabbit(**behaviour)
    server = _Server(rabbit)
    rabbit.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield rabbit
    finally:
        _stop(server, server.clients)


@dataclass
class SilentPath:
    """A proxy's switch, and what it saw."""

    port: int = 0
    #: Set: bytes are swallowed both ways, the connections left open.
    silent: threading.Event = field(default_factory=threading.Event)
    #: Set when a client's socket closed (the proxy read its end).
    closed: threading.Event = field(default_factory=threading.Event)


def _pump(source: socket.socket, target: socket.socket, path: SilentPath, client_side: bool) -> None:
    try:
        while data := source.recv(65536):
            if not path.silent.is_set():
                target.sendall(data)
    except OSError:
        pass
    finally:
        if client_side:
            path.closed.set()
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def silenceable_path(host: str, port: int) -> Iterator[SilentPath]:
    """A :class:`SilentPath` forwarding each connection on a free local port to ``host:port``.
    When the block ends, every socket is shut down: a client the test left waiting returns."""
    path = SilentPath()
    sockets: list[socket.socket] = []

    class Forward(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            upstream = socket.create_connection((host, port), timeout=5)
            upstream.settimeout(None)
            sockets.extend([self.request, upstream])
            back = threading.Thread(target=_pump, args=(upstream, self.request, path, False), daemon=True)
            back.start()
            _pump(self.request, upstream, path, True)
            back.join()

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Forward)
    server.daemon_threads, server.block_on_close = True, False
    path.port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield path
    finally:
        _stop(server, sockets)


def _stop(server: socketserver.TCPServer, sockets: list[socket.socket]) -> None:
    """Stop accepting, and shut ``sockets`` down: a client left waiting sees the end of its stream."""
    server.shutdown()
    for each in sockets:
        with contextlib.suppress(OSError):
            each.shutdown(socket.SHUT_RDWR)
    server.server_close()
