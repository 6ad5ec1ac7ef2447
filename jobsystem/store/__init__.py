"""The shared state store (Redis or SQLite, chosen by URL) and the features' operations on it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar
from urllib.parse import unquote, urlsplit

from jobsystem.store.base import StateStore, StoreMisconfigured, StoreUnavailable
from jobsystem.store.redis import RedisStore
from jobsystem.store.sqlite import SqliteStore

__all__ = [
    "RedisStore",
    "SqliteStore",
    "StateStore",
    "StoreMisconfigured",
    "StoreUnavailable",
    "for_backend",
    "open_store",
]

Operations = TypeVar("Operations")


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


def for_backend(
    store: StateStore,
    *,
    redis: Callable[[RedisStore], Operations],
    sqlite: Callable[[SqliteStore], Operations],
) -> Operations:
    """A feature's operations on ``store``: ``redis(store)`` or ``sqlite(store)``, by its backend."""
    if isinstance(store, RedisStore):
        return redis(store)
    if isinstance(store, SqliteStore):
        return sqlite(store)
    raise TypeError(f"no operations for a {type(store).__name__}")
