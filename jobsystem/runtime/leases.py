"""The run leases a process holds, renewed together from one background thread while they are held,
and the names of their owners."""

from __future__ import annotations

import itertools
import logging
import os
import threading
import uuid
from collections.abc import Callable

from jobsystem.privacy.outage_lines import log_outage
from jobsystem.store.base import StoreUnavailable

__all__ = ["HeldLeases", "new_owner"]

logger = logging.getLogger(__name__)


class _Owners:
    """Lease owners unique across processes and hosts without a random draw per lease: a random
    token per process (drawn again in a forked child) and a counter."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._token = uuid.uuid4().hex[:20]
        self._counter = itertools.count()

    def __call__(self) -> str:
        return f"{self._token}{next(self._counter):x}"


#: A new owner name for a lease (an idempotency claim), unique across processes and hosts.
new_owner = _Owners()


class HeldLeases:
    """Leases held by this process's worker threads, all renewed every third of ``lease_ms``.

    A process killed mid-job stops renewing, so its leases lapse within one lease period.

    Parameters:
      renew: renews ``[(key, owner), ...]`` for ``lease_ms`` in one store operation; whatever it
        raises is logged (:class:`~jobsystem.store.base.StoreUnavailable` at WARNING, anything
        else at ERROR, by class) and the next turn tries again. The renewer never ends on an
        error: it started again only with the next new lease, and meanwhile a long job's lease
        lapsed and another worker could claim and run the same key beside it.
      lease_ms: how long a lease lasts unless renewed.
    """

    def __init__(self, renew: Callable[[list[tuple[str, str]], int], None], lease_ms: int) -> None:
        self.renew = renew
        self.lease_ms = lease_ms
        self._held: dict[int, tuple[str, str]] = {}
        self._tokens = itertools.count()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def hold(self, key: str, owner: str) -> int:
        """Keep ``owner``'s lease on ``key`` alive until :meth:`release` is given the token returned."""
        with self._lock:
            token = next(self._tokens)
            self._held[token] = (key, owner)
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                self._thread = threading.Thread(target=self._run, name="lease-renewer", daemon=True)
                self._thread.start()
        return token

    def release(self, token: int) -> None:
        """Stop renewing the lease held under ``token`` (giving it back is the caller's)."""
        with self._lock:
            self._held.pop(token, None)

    def stop(self) -> None:
        """Stop renewing (the worker is shutting down)."""
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.lease_ms / 3000):
            with self._lock:
                claims = list(self._held.values())
            if not claims:
                continue
            try:
                self.renew(claims, self.lease_ms)
            except Exception as exc:  # any: a renewer that ended let long jobs' leases lapse
                level = logging.WARNING if isinstance(exc, StoreUnavailable) else logging.ERROR
                log_outage(logger, level, "lease_renewal_failed", exc, claims=len(claims))
