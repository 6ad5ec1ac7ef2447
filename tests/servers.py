"""Stand-ins the tests run in-process for services the system talks to: SMTP servers (aiosmtpd, and
a scripted one whose every reply a test chooses), a Sentry endpoint, a server that accepts
connections and never answers, a self-signed certificate, and a free port for anything else."""

from __future__ import annotations

import contextlib
import socketserver
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench.ports import free_port

__all__ = [
    "free_port",
    "scripted_smtp",
    "self_signed_certificate",
    "sent_to_sentry",
    "sentry_events",
    "sentry_server",
    "server_tls",
    "silent_server",
    "smtp_server",
]


@contextlib.contextmanager
def smtp_server() -> Iterator[tuple[int, list[Any]]]:
    """A real SMTP server in this process; yields its port and the list the mails arrive in."""
    from email import message_from_bytes

    from aiosmtpd.controller import Controller

    received: list[Any] = []

    class Handler:
        async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
            if address.startswith("bounce"):
                return "550 5.1.1 no such user"
            envelope.rcpt_tos.append(address)
            return "250 OK"

        async def handle_DATA(self, server, session, envelope):
            received.append(message_from_bytes(envelope.content))
            return "250 Message accepted"

    port = free_port()
    controller = Controller(Handler(), hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield port, received
    finally:
        controller.stop()


@contextlib.contextmanager
def silent_server() -> Iterator[int]:
    """A TCP server that accepts every connection and never sends a byte (a service that hangs:
    RabbitMQ, its management API, Redis); yields its port."""
    import socket

    listener = socket.create_server(("127.0.0.1", 0), backlog=64)
    accepted: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):  # the listener closed
            while True:
                accepted.append(listener.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)  # wakes the accept
        listener.close()
        for connection in accepted:
            connection.close()


def self_signed_certificate(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 that no one trusts unless told to (``SSL_CERT_FILE``), and its key."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    command = ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
    command += ["-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=127.0.0.1"]
    subprocess.run([*command, "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return cert, key


def server_tls(cert: Path, key: Path) -> ssl.SSLContext:
    """A server-side TLS context presenting ``cert``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context


@contextlib.contextmanager
def scripted_smtp(
    replies: Mapping[str, str] | None = None, *, tls: ssl.SSLContext | None = None
) -> Iterator[tuple[int, list[bytes]]]:
    """An SMTP server answering each command with the reply ``replies`` gives for its verb (``RCPT``,
    ``DATA`` for the end of the mail, ``QUIT``, ...), else a success; ``"hang"`` answers nothing.
    With ``tls``, TLS from the start (``smtps://``). Yields its port and the mails it accepted."""
    script, received, stop = dict(replies or {}), [], threading.Event()
    defaults = {"EHLO": "250 scripted", "DATA": "250 accepted", "QUIT": "221 bye"}

    class Handler(socketserver.StreamRequestHandler):
        def answer(self, verb: str) -> bool:
            reply = script.get(verb, defaults.get(verb, "250 ok"))
            if reply == "hang":
                stop.wait(30)
                return False
            self.wfile.write(reply.encode() + b"\r\n")
            return verb != "QUIT"

        def handle(self) -> None:
            self.wfile.write(b"220 scripted ESMTP\r\n")
            while line := self.rfile.readline():
                verb = line.split(b" ", 1)[0].split(b":", 1)[0].strip().upper().decode()
                if verb == "DATA":
                    self.wfile.write(b"354 go on\r\n")
                    mail = b""
                    while (data := self.rfile.readline()) not in (b".\r\n", b""):
                        mail += data
                    if script.get("DATA", "2").startswith("2"):
                        received.append(mail)
                if not self.answer(verb):
                    return

    class Server(socketserver.ThreadingTCPServer):
        daemon_threads = True
        block_on_close = False

        def get_request(self) -> tuple[Any, Any]:
            connection, address = super().get_request()
            return (tls.wrap_socket(connection, server_side=True) if tls else connection), address

    server = Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], received
    finally:
        stop.set()
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def sentry_server() -> Iterator[tuple[str, list[bytes]]]:
    """A local HTTP endpoint that records what a Sentry SDK sends; yields a DSN and the bodies received.

    Bodies are envelopes (one JSON header line, then item headers and payloads), decompressed.
    """
    import gzip

    received: list[bytes] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            elif self.headers.get("Content-Encoding") == "br":
                import brotli  # only if the SDK found it installed

                body = brotli.decompress(body)
            received.append(body)
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the test reads what was received, not an access log."""

    with http_serving(Handler) as port:
        yield f"http://public@127.0.0.1:{port}/1", received


@contextlib.contextmanager
def http_serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[int]:
    """``handler`` served on 127.0.0.1 by a thread while the block runs; yields the port."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_port
    finally:
        server.shutdown()
        server.server_close()


def sentry_events(envelopes: list[bytes]) -> list[dict[str, Any]]:
    """The error events inside Sentry envelopes."""
    import json

    events = []
    for envelope in envelopes:
        lines = envelope.split(b"\n")
        position = 1  # after the envelope header
        while position < len(lines) and lines[position].strip():
            header = json.loads(lines[position])
            payload = lines[position + 1]
            if header.get("type") == "event":
                events.append(json.loads(payload))
            position += 2
    return events


def sent_to_sentry(act: Callable[[], None], *, log_level: str = "INFO") -> tuple[str, str]:
    """What a process with ``SENTRY_DSN`` set sends Sentry while ``act`` runs, and what it logs.

    Logging and Sentry are set up as in every worker (``configure_logging``, ``configure_sentry``:
    ERROR lines become events, INFO and WARNING ones breadcrumbs). An ERROR line logged after
    ``act`` carries the breadcrumbs of its lines. Returns the events as JSON text and the log's
    JSON lines. The caller restores logging afterwards (the ``logging_restored`` fixture). The
    breadcrumbs ``act`` left in Sentry's scopes are cleared: they would ride on the events of a
    later test (one that asserts an address is never sent, say)."""
    import io
    import json
    import logging

    import sentry_sdk
    import structlog

    from jobsystem.observability.logs import configure_logging
    from jobsystem.observability.sentry import configure_sentry
    from jobsystem.settings import load_settings

    log = io.StringIO()
    with sentry_server() as (dsn, envelopes):
        settings = load_settings({"SENTRY_DSN": dsn, "LOG_LEVEL": log_level, "LOG_FORMAT": "json"})
        logging.getLogger().addHandler(logging.StreamHandler(log))
        configure_logging(settings)
        configure_sentry(settings)
        try:
            act()
            structlog.get_logger("tests").error("later_error")  # any later error of the process
            sentry_sdk.flush(5)
        finally:
            sentry_sdk.get_client().close()
            sentry_sdk.get_global_scope().set_client(None)
            for scope in (
                sentry_sdk.get_isolation_scope(),
                sentry_sdk.get_current_scope(),
                sentry_sdk.get_global_scope(),
            ):
                scope.clear_breadcrumbs()
        return json.dumps(sentry_events(list(envelopes))), log.getvalue()


@contextlib.contextmanager
def recording_server() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """An HTTP server (a webhook, an API an actor calls) recording each GET's headers; yields
    its URL and the headers received."""
    received: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            received.append(dict(self.headers.items()))
            self.send_response(204)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet."""

    with http_serving(Handler) as port:
        yield f"http://127.0.0.1:{port}/hook", received
