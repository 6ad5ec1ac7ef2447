"""One call to RabbitMQ's management API, answered in full within one deadline or given up.

``requests``' ``timeout`` bounds each socket operation, not the call: a server (or a proxy in
front of it) that accepts and then sends a byte every few seconds holds the caller for as long
as it likes, a health check thread or a dashboard request thread included. Here the socket of
the call is shut down when the deadline passes, whatever phase the call is in (the headers, the
body, a TLS handshake, a proxy's tunnel), so the blocked read ends at once and the call raises
:class:`ManagementTimeout`. The connect itself is bounded by the time left (name resolution is
not: the management API is normally named by an address or ``localhost``).

The call watches a duplicate of each socket's descriptor: TLS wraps a socket by detaching its
descriptor (shutting the plain socket object down then does nothing), but a shutdown through
any descriptor of a connection ends every read on it, the TLS socket's included (HTTPS through
a proxy: TLS in a tunnel, still one TCP connection). A proxy (``HTTP(S)_PROXY``) gets the same
watched pools; ``trust_env`` stays on, as ``REQUESTS_CA_BUNDLE`` is read from the environment.

Credentials never ride in the URL: ``requests`` quotes a call's URL in its errors (``401 Client
Error: Unauthorized for url: ...``), and those texts reach logs, ``jobctl`` output and JSON
summaries. They go in the ``Authorization`` header (``auth``); a URL given with userinfo has it
split off here, so no caller can put a password back into an error text.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from requests.auth import HTTPBasicAuth
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from jobsystem.ops.deadline import Deadline
from jobsystem.urls import split_credentials

__all__ = ["ManagementTimeout", "call_json"]


class ManagementTimeout(requests.Timeout):
    """The management API had not answered in full when the call's deadline passed."""


class _Cutter:
    """Duplicates of the sockets one call opened, shut down together when its deadline passes
    (a duplicate outlives TLS's detaching of the original), closed when the call ends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self.fired = False
        self._closed = False

    def add(self, sock: socket.socket) -> None:
        with self._lock:
            if self._closed:  # not this call's: nothing to watch
                return
            watched = sock.dup()
            self._sockets.append(watched)
            if self.fired:  # opened after the deadline: no read on it may wait
                _shut(watched)

    def fire(self) -> None:
        with self._lock:
            self.fired = True
            for sock in self._sockets:
                _shut(sock)

    def close(self) -> None:
        """Close the duplicates (the connection itself closes with its owner)."""
        with self._lock:
            self._closed = True
            for sock in self._sockets:
                sock.close()
            self._sockets.clear()


def _shut(sock: socket.socket) -> None:
    """End every read blocked on ``sock`` now (the owner closes it)."""
    with contextlib.suppress(OSError):  # already closed or not connected
        sock.shutdown(socket.SHUT_RDWR)


_calling = threading.local()  # the cutter of the call this thread is making


class _Watched(HTTPConnection):
    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        cutter: _Cutter | None = getattr(_calling, "cutter", None)
        if cutter is not None:
            cutter.add(sock)
        return sock


class _WatchedTLS(_Watched, HTTPSConnection):
    pass


class _Pool(HTTPConnectionPool):
    ConnectionCls = _Watched


class _TLSPool(HTTPSConnectionPool):
    ConnectionCls = _WatchedTLS


_WATCHED_POOLS = {"http": _Pool, "https": _TLSPool}


class _Adapter(HTTPAdapter):
    """requests' adapter, its connections' sockets handed to the calling thread's cutter, direct
    or through an HTTP(S) proxy."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = dict(_WATCHED_POOLS)

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if not proxy.lower().startswith("socks"):  # SOCKS pools have connections of their own
            manager.pool_classes_by_scheme = dict(_WATCHED_POOLS)
        return manager


@contextlib.contextmanager
def _cut_at(deadline: Deadline) -> Iterator[_Cutter]:
    cutter = _Cutter()
    timer = threading.Timer(deadline.remaining(), cutter.fire)
    timer.daemon = True
    _calling.cutter = cutter
    timer.start()
    try:
        yield cutter
    finally:
        timer.cancel()
        _calling.cutter = None
        cutter.close()


def call_json(
    method: str, url: str, seconds: float, *, auth: tuple[str, str] | None = None, **kwargs: Any
) -> Any:
    """The JSON answer of ``method url`` (``requests``' keyword arguments: ``params``, ``json``)
    within ``seconds`` in all, as ``auth`` (user, password); None for an empty answer (a DELETE's
    204). Raises :class:`ManagementTimeout` past it, and otherwise what ``requests`` raises (an
    error status included): every error is a ``RequestException``, its text free of credentials."""
    url, own = split_credentials(url)
    auth = auth or own
    # requests encodes str credentials as latin-1 (a "€" raises, an "ä" is one byte RabbitMQ,
    # which compares UTF-8, refuses): the header gets their UTF-8 bytes.
    credentials = None if auth is None else HTTPBasicAuth(auth[0].encode(), auth[1].encode())
    deadline = Deadline(seconds)
    with requests.Session() as session, _cut_at(deadline) as cutter:
        session.mount("http://", _Adapter())
        session.mount("https://", _Adapter())
        try:
            response = session.request(method, url, timeout=deadline.remaining(), auth=credentials, **kwargs)
            response.raise_for_status()
        except requests.RequestException as exc:
            if cutter.fired:
                raise ManagementTimeout(f"no full answer within {seconds:g} s") from exc
            raise
        if cutter.fired:  # the body may have been cut short where it could end (no length given)
            raise ManagementTimeout(f"no full answer within {seconds:g} s")
    if not response.content:
        return None
    return response.json()  # a body that is not JSON: requests.JSONDecodeError
