"""One call to RabbitMQ's management API, answered in full within one deadline or given up.

``requests``' ``timeout`` bounds each socket operation, not the call: a server (or a proxy in
front of it) that accepts and then sends a byte every few seconds holds the caller for as long
as it likes, a health check thread or a dashboard request thread included. Here the socket of
the call is shut down when the deadline passes, whatever phase the call is in (the headers, the
body, a TLS handshake, a proxy's tunnel), so the blocked read ends at once and the call raises
:class:`ManagementTimeout`. Before that, the host's name (or the proxy's) is looked up by the
same deadline (:mod:`jobsystem.ops.resolver`: a resolver that does not answer costs the call its
deadline, not more), and each connect is bounded by the time left.

The call watches a duplicate of each socket's descriptor: TLS wraps a socket by detaching its
descriptor (shutting the plain socket object down then does nothing), but a shutdown through
any descriptor of a connection ends every read on it, the TLS socket's included (HTTPS through
a proxy: TLS in a tunnel, still one TCP connection). A proxy (``HTTP(S)_PROXY``) gets the same
watched pools; ``trust_env`` stays on, as ``REQUESTS_CA_BUNDLE`` is read from the environment.
A SOCKS proxy is refused (:class:`SocksProxyRefused`, and at start-up by the settings): its
connections are PySocks', which look names up and read the proxy's answers where no deadline
reaches.

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
from urllib3.exceptions import ConnectTimeoutError, NameResolutionError, NewConnectionError
from urllib3.util.connection import allowed_gai_family

from jobsystem.ops.deadline import Deadline, Late
from jobsystem.ops.resolver import resolve
from jobsystem.urls import SOCKS_REFUSED, socks_proxy_variable, split_credentials

__all__ = ["ManagementTimeout", "SocksProxyRefused", "call_json"]


class ManagementTimeout(requests.Timeout):
    """The management API had not answered in full when the call's deadline passed."""


class SocksProxyRefused(requests.exceptions.InvalidProxyURL):
    """The environment routes the management API through a SOCKS proxy, whose connections no
    deadline can end (see the module's text)."""


class _Cutter:
    """Duplicates of the sockets one call opened, shut down together when its deadline passes
    (a duplicate outlives TLS's detaching of the original), closed when the call ends."""

    def __init__(self, deadline: Deadline) -> None:
        self.deadline = deadline
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
        cutter: _Cutter | None = getattr(_calling, "cutter", None)
        if cutter is None:  # not a call of call_json's
            return super()._new_conn()
        sock = self._connect_by(cutter)
        cutter.add(sock)
        return sock

    def _connect_by(self, cutter: _Cutter) -> socket.socket:
        """A connection to the first of the host's addresses that takes one, its name looked up
        and each connect ended by the call's deadline (urllib3's errors, as its own lookup's)."""
        name, timeout = self._dns_host, self.timeout
        try:
            addresses = resolve(name, self.port, cutter.deadline, allowed_gai_family())
        except Late as exc:
            cutter.fire()
            raise ConnectTimeoutError(self, "host name not resolved before the deadline") from exc
        except socket.gaierror as exc:
            raise NameResolutionError(self.host, self, exc) from exc
        failed: NewConnectionError | ConnectTimeoutError | None = None
        try:
            for address in addresses:  # as urllib3 tries them: ::1, then 127.0.0.1 for localhost
                self._dns_host = address
                left = cutter.deadline.remaining()
                self.timeout = min(timeout, left) if isinstance(timeout, int | float) else left
                try:
                    if not left:
                        raise ConnectTimeoutError(self, "no time left to connect")
                    return super()._new_conn()
                except (NewConnectionError, ConnectTimeoutError) as exc:
                    failed = exc
                    if not cutter.deadline.remaining():  # the deadline's doing: no next address
                        cutter.fire()
                        raise
        finally:
            self._dns_host, self.timeout = name, timeout
        raise failed or NewConnectionError(self, "the host name has no address")


class _WatchedTLS(_Watched, HTTPSConnection):
    pass


class _Pool(HTTPConnectionPool):
    ConnectionCls = _Watched


class _TLSPool(HTTPSConnectionPool):
    ConnectionCls = _WatchedTLS


_WATCHED_POOLS = {"http": _Pool, "https": _TLSPool}


class _Adapter(HTTPAdapter):
    """requests' adapter for a call to ``url``, its connections' sockets handed to the calling
    thread's cutter, direct or through an HTTP(S) proxy; a SOCKS proxy refused."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = dict(_WATCHED_POOLS)

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        if proxy.lower().startswith("socks"):  # PySocks' connections: nothing here can end them
            raise SocksProxyRefused(_socks_refusal(self.url))
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        manager.pool_classes_by_scheme = dict(_WATCHED_POOLS)
        return manager


def _socks_refusal(url: str) -> str:
    """Why a call through a SOCKS proxy is refused, naming the variable that sets it."""
    return f"{socks_proxy_variable(url) or 'a *_PROXY variable'}: {SOCKS_REFUSED}"


@contextlib.contextmanager
def _cut_at(deadline: Deadline) -> Iterator[_Cutter]:
    cutter = _Cutter(deadline)
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
        session.mount("http://", _Adapter(url))
        session.mount("https://", _Adapter(url))
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
