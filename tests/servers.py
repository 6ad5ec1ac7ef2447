"""Stand-ins the tests run in-process for services the system talks to: an SMTP server, a Sentry
endpoint, a self-signed certificate, and a free port for anything else."""

from __future__ import annotations

import contextlib
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.ports import free_port

__all__ = [
    "free_port",
    "self_signed_certificate",
    "sentry_events",
    "sentry_server",
    "server_tls",
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
def sentry_server() -> Iterator[tuple[str, list[bytes]]]:
    """A local HTTP endpoint that records what a Sentry SDK sends; yields a DSN and the bodies received.

    Bodies are envelopes (one JSON header line, then item headers and payloads), decompressed.
    """
    import gzip
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

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

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://public@127.0.0.1:{server.server_port}/1", received
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
