"""The shared state store (Redis or SQLite, chosen by URL) and the features' operations on it."""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

from jobsystem.store.base import Backends, StateStore, StoreMisconfigured, StoreUnavailable
from jobsystem.store.redis import RedisStore
from jobsystem.store.sqlite import SqliteStore

__all__ = [
    "Backends",
    "RedisStore",
    "SqliteStore",
    "StateStore",
    "StoreMisconfigured",
    "StoreUnavailable",
    "open_store",
]


def open_store(url: str, *, namespace: str = "jobs:", timeout: float = 2.0) -> StateStore:
    """The store named by ``url``: ``redis://host:port/db`` or ``sqlite:///path/to/file.db``.

    ``timeout`` bounds every Redis call, so a slow store never blocks a sender for long; on SQLite
    it bounds the wait for another process's write lock.
    """
    parts = urlsplit(url)
    if parts.scheme in ("redis", "rediss"):
        return RedisStore(url, namespace=namespace, socket_timeout=timeout)
    if parts.scheme == "sqlite":
        # sqlite:///relative/path and sqlite:////absolute/path, as SQLAlchemy spells them.
        path = unquote(parts.path[1:]) if parts.path.startswith("/") else unquote(parts.path)
        return SqliteStore(path or "state.db", namespace=namespace, busy_timeout_ms=int(timeout * 5000))
    raise ValueError(f"unsupported state store URL scheme {parts.scheme!r}")
