"""The state store's interface and its failure contract, whatever the backend.

Every feature (idempotency keys, token buckets, job status, leases) talks to a :class:`StateStore`;
every error a backend meets surfaces as :class:`StoreUnavailable` (wait and try again: callers fail
closed) or :class:`StoreMisconfigured` (it will never serve this configuration).
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from jobsystem.store.redis import RedisStore
    from jobsystem.store.sqlite import SqliteStore

__all__ = ["Backends", "StateStore", "StoreMisconfigured", "StoreUnavailable"]

Operations = TypeVar("Operations")


class StoreUnavailable(RuntimeError):
    """The state store could not be reached or answered with an error: callers fail closed.

    Every error a backend can raise surfaces as this class or its subclass
    :class:`StoreMisconfigured` (see :func:`~jobsystem.store.redis.redis_error`,
    :func:`~jobsystem.store.sqlite.sqlite_error`), so one ``except``
    covers connection refusals, timeouts and error replies alike (``OOM``, ``READONLY``, ``BUSY``,
    a script lost in a restart, a reply of the wrong shape).
    """


class StoreMisconfigured(StoreUnavailable):
    """The store answers, but will never serve this configuration (a database index it does not
    have, credentials it refuses, a file that is not a database): a worker stops at start-up with
    the setting named; at run time it is handled like any outage."""


@dataclass(frozen=True)
class Backends(Generic[Operations]):
    """A feature's operations, one implementation per backend; each store picks its own
    (:meth:`StateStore.operations`). A new backend is a new field here: every feature that does
    not implement it then fails the type check."""

    redis: Callable[[RedisStore], Operations]
    sqlite: Callable[[SqliteStore], Operations]


class StateStore(ABC):
    """Keys with values and TTLs, leases with owners, the store's clock, and batches of writes."""

    #: "redis" or "sqlite": single-host stores warn at worker start.
    kind: str
    #: A description of the store safe to log (no password).
    label: str
    #: Prefix of every key: environments sharing one store stay apart.
    namespace: str = ""
    #: Seconds one call may take before it fails (Redis's socket timeout, SQLite's busy timeout).
    timeout: float = 2.0
    #: Whether a :meth:`batch` that fails is undone whole (SQLite: one transaction rolled back) or
    #: each write made before the failure stands (Redis): what a retry of the batch must write again.
    atomic_batch: bool

    def key(self, name: str) -> str:
        """``name`` within this store's namespace."""
        return self.namespace + name

    @abstractmethod
    def operations(self, backends: Backends[Operations]) -> Operations:
        """A feature's operations on this store: its implementation for this backend."""

    @abstractmethod
    def errors(self) -> AbstractContextManager[None]:
        """A context in which anything the backend's client raises becomes a store error (see
        :class:`StoreUnavailable`): the one place a feature's own calls are translated."""

    @abstractmethod
    def now_ms(self) -> int:
        """The store's clock in milliseconds: every host measures time by the same clock."""

    @abstractmethod
    def get(self, key: str) -> bytes | None:
        """The value of ``key``, or None when it is missing or expired."""

    @abstractmethod
    def set(self, key: str, value: bytes | str, ttl_ms: int | None = None) -> None:
        """Set ``key`` (expiring after ``ttl_ms`` when given)."""

    @abstractmethod
    def delete(self, *keys: str) -> None:
        """Remove ``keys``; missing keys are ignored."""

    @abstractmethod
    def acquire_lease(self, name: str, owner: str, ttl_ms: int) -> bool:
        """Take the lease ``name`` for ``owner``, or renew it if ``owner`` holds it already.

        Returns False while another owner holds an unexpired lease. A lease whose holder died
        expires after ``ttl_ms``, so nothing stays stuck after a SIGKILL.
        """

    @abstractmethod
    def release_lease(self, name: str, owner: str) -> bool:
        """Give up ``name`` if ``owner`` holds it; returns whether it did."""

    @abstractmethod
    def lease_holder(self, name: str) -> str | None:
        """The owner of an unexpired lease ``name``, if any."""

    @abstractmethod
    @contextmanager
    def batch(self) -> Iterator[StateStore]:
        """A view of this store for a group of writes.

        On SQLite they share one transaction (one lock, one commit). On Redis each write is sent
        as it is made: features batch by sending many items in one script call, which costs one
        round trip without a pipeline's script bookkeeping.
        """

    @abstractmethod
    def ping(self) -> None:
        """Raise :class:`StoreUnavailable` unless the store answers."""

    def check(self) -> None:
        """Raise a store error unless the store answers *and* accepts writes: a probe lease (a
        script and a write on Redis, a write transaction on SQLite), given back at once. A read-only
        replica or a full Redis answers a ping but refuses this."""
        probe, owner = f"probe:{uuid.uuid4().hex}", "probe"
        if not self.acquire_lease(probe, owner, 10_000):
            raise StoreUnavailable("the store did not grant a fresh probe lease")
        self.release_lease(probe, owner)

    @abstractmethod
    def release_thread(self) -> None:
        """Give back what the calling thread holds, as it is about to end (an SQLite store's
        connection, opened per thread); nothing on a store whose connections are shared."""

    @abstractmethod
    def close(self) -> None:
        """Release connections."""
