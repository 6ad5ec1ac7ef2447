"""The management call's deadline over HTTPS and through a proxy: TLS wraps the socket the call
watched by detaching it, so shutting that one down ended no read on the TLS socket (a trickling
HTTPS server held a 2 s call 10 s); and with ``HTTP(S)_PROXY`` set, requests' proxy manager made
connections nobody watched. Each server here trickles (a byte now and then, far inside the
per-read timeout): only the total deadline can end the call."""

from __future__ import annotations

import contextlib
import socket
import ssl
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jobsystem.ops.management_http import ManagementTimeout, call_json
from tests.support import wait_for, within
from tests.unit.test_management_deadline import DEADLINE_S, Trickle, _answer, serving, trickling_server

Handler = Callable[[socket.socket, Trickle], None]


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key."""
    where = tmp_path_factory.mktemp("tls")
    cert, key = where / "cert.pem", where / "key.pem"
    command = "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2"
    names = ["-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"]
    subprocess.run([*command.split(), "-keyout", key, "-out", cert, *names], check=True, capture_output=True)
    return cert, key


@pytest.fixture(autouse=True)
def no_proxy_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


def _tls(certificate: tuple[Path, Path], phase: str) -> Handler:
    """The trickling answer of ``phase`` (see ``_answer``), after a TLS handshake made at once."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*certificate)

    def handle(connection: socket.socket, trickle: Trickle) -> None:
        try:
            wrapped = context.wrap_socket(connection, server_side=True)
        except OSError:
            connection.close()
            return
        _answer(wrapped, trickle, phase)

    return handle


def _tunnel(upstream_port: int) -> Handler:
    """An HTTP proxy: a CONNECT answered at once, then a tunnel to 127.0.0.1:``upstream_port``
    (whatever the CONNECT names), both ways at full speed."""

    def handle(connection: socket.socket, trickle: Trickle) -> None:
        with connection, socket.create_connection(("127.0.0.1", upstream_port)) as upstream:
            head = b""
            while b"\r\n\r\n" not in head:
                head += connection.recv(65536)
            assert head.startswith(b"CONNECT "), head
            connection.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            trickle.first_byte.set()
            threading.Thread(target=_pump, args=(connection, upstream), daemon=True).start()
            _pump(upstream, connection)

    return handle


def _pump(source: socket.socket, target: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            target.sendall(data)


def _given_up(url: str, **kwargs: Any) -> None:
    outcome = within(DEADLINE_S + 5, lambda: call_json("GET", url, DEADLINE_S, **kwargs))
    assert isinstance(outcome, ManagementTimeout), outcome


@pytest.mark.parametrize("phase", ["headers", "body"])
def test_an_https_api_that_trickles_its_answer_is_given_up_at_the_deadline(certificate, phase):
    with serving(_tls(certificate, phase)) as trickle:
        _given_up(f"https://127.0.0.1:{trickle.port}/api/queues", verify=str(certificate[0]))
        assert trickle.first_byte.is_set() and trickle.finished == 0


def test_an_https_api_that_answers_at_once_is_read_as_before(certificate):
    with serving(_tls(certificate, "none")) as trickle:
        url = f"https://127.0.0.1:{trickle.port}/api/queues"
        assert call_json("GET", url, DEADLINE_S, verify=str(certificate[0]))[0]["name"] == "queue-0"


@pytest.mark.parametrize("phase", ["headers", "body"])
def test_a_proxy_that_trickles_the_answer_is_given_up_at_the_deadline(monkeypatch, phase):
    with trickling_server(phase) as proxy:
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.port}")
        _given_up("http://127.0.0.1:1/api/queues")  # nothing listens there: only the proxy answers
        assert proxy.first_byte.is_set() and proxy.finished == 0


def test_an_https_api_that_trickles_through_a_proxy_is_given_up_at_the_deadline(monkeypatch, certificate):
    with serving(_tls(certificate, "body")) as server, serving(_tunnel(server.port)) as proxy:
        monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{proxy.port}")
        _given_up("https://127.0.0.1:1/api/queues", verify=str(certificate[0]))  # only the proxy leads there
        assert proxy.first_byte.is_set() and server.first_byte.is_set() and server.finished == 0


def test_a_proxy_that_answers_at_once_is_read_as_before(monkeypatch):
    with trickling_server("none") as proxy:
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.port}")
        assert len(call_json("GET", "http://127.0.0.1:1/api/queues", DEADLINE_S)) == 10
        wait_for(lambda: proxy.finished == 1, what="the proxy to count its answer sent")
