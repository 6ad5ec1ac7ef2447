"""One leader among processes that share a state store, by a lease with a TTL.

The holder renews the lease every third of its TTL; standbys try to take it every tenth. A leader
that dies stops renewing, its lease lapses at most one TTL after its death, and a standby takes it
at its next attempt: a take-over costs at most ``1.1 * ttl``. Nothing stays stuck after a SIGKILL.

A process counts itself leader only until 90% of the TTL after the start of its last successful
renewal, measured on its own monotonic clock. It therefore steps down *before* the store can let
another process in, even when the store stops answering. Two leaders can still overlap if a
process is paused longer than that between checking and acting (GC, SIGSTOP, a VM migration), so
the work a leader does must be safe to repeat (the scheduler's fires carry idempotency keys).

A lapse ends a term even when no one else took the lease and this process renews it: work refused
while it lapsed (a fire skipped during a pause) is otherwise never done. So a lapse seen by a poll,
or by a caller of :attr:`LeaderLease.is_leader` (work refused), is a loss, and the renewal that
follows a new election: ``on_lost`` then ``on_elected``, whose catch-up does the refused work.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable

from jobsystem.privacy.outage_lines import log_outage
from jobsystem.store.base import StateStore, StoreUnavailable

logger = logging.getLogger(__name__)


class LeaderLease:
    """Leadership of ``name`` for this process, kept by a background thread.

    Parameters:
      store: the shared state store (its lease operations; the name is namespaced by the store).
      name: the lease's name; processes competing for the same work use the same name.
      ttl_ms: the lease's time to live; renewed every third of it, tried for every tenth.
      on_elected, on_lost: called from the lease thread when this process becomes leader or stops
        being it (lost to another, lapsed while the store was unreachable, or released at stop;
        :attr:`renewed` tells a lapse this process renewed at once). They are called holding the
        lease's lock and must return quickly, with no store call: a slow callback delays the next
        renewal, and after a renewed lapse the new term's ``on_elected``.
      owner: this process's identity in the store (host, pid and a random part by default).
    """

    def __init__(
        self,
        store: StateStore,
        name: str,
        *,
        ttl_ms: int,
        on_elected: Callable[[], None] | None = None,
        on_lost: Callable[[], None] | None = None,
        owner: str | None = None,
    ) -> None:
        self.store = store
        self.name = name
        self.ttl_ms = ttl_ms
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.on_elected = on_elected
        self.on_lost = on_lost
        self._valid_until = 0.0
        self._leader = False
        #: Whether this term's lease was seen lapsed (see the module's docstring).
        self._lapsed = False
        #: Whether the term ``on_lost`` ends lapsed and was renewed at once by this process (a new
        #: term follows: ``on_elected`` next), rather than lost, lapsed for good or released.
        self.renewed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def is_leader(self) -> bool:
        """Whether this process holds the lease, with a margin before the store would expire it.

        A False while the lease thread still counts this process leader is a lapse: the caller
        refuses work, so the next renewal counts as a new election and its catch-up does the work.
        """
        if time.monotonic() < self._valid_until:
            return True
        if self._leader:
            self._lapsed = True
        return False

    def start(self) -> None:
        """Try to take the lease now, then keep trying (or renewing) on a background thread."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"lease-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, *, release: bool = True) -> None:
        """Stop renewing and, with ``release``, give the lease up so a standby takes over at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.ttl_ms / 1000 + 10)
        with self._lock:
            if release and self._leader:
                try:
                    self.store.release_lease(self.name, self.owner)
                except StoreUnavailable as exc:
                    log_outage(logger, logging.WARNING, "leader_release_failed", exc, lease=self.name)
            self._valid_until = 0.0
            self._transition()

    def poll(self) -> bool:
        """One attempt to take or renew the lease; returns whether this process leads now."""
        with self._lock:
            started = time.monotonic()
            if self._leader and started >= self._valid_until:
                self._lapsed = True  # since the last renewal: the store may have expired it too
            try:
                held = self.store.acquire_lease(self.name, self.owner, self.ttl_ms)
            except StoreUnavailable as exc:
                # Keep what is left of the lease: it lapses by itself if the store stays away.
                log_outage(logger, logging.WARNING, "leader_lease_unavailable", exc, lease=self.name)
            else:
                self._valid_until = started + self.ttl_ms * 0.9 / 1000 if held else 0.0
            self._transition()
            return self.is_leader

    def _transition(self) -> None:
        leader = time.monotonic() < self._valid_until  # not is_leader: the lease thread's own look
        if self._leader and (self._lapsed or not leader):
            self.renewed = leader  # still valid: lapsed and renewed, a new term follows
            self._announce(False)  # lost, released, or lapsed and renewed
        if leader and not self._leader:
            self._announce(True)

    def _announce(self, leader: bool) -> None:
        """Start or end a term: log it and call its callback.

        A lapse seen by another thread just after this clears the mark only costs one needless
        new term at the next poll (its catch-up finds nothing due).
        """
        lapsed, self._leader, self._lapsed = self._lapsed, leader, False
        fields = {"lease": self.name, "owner": self.owner}
        if leader:
            logger.info("leader_elected", extra=fields)
        else:
            logger.info("leader_lost", extra={**fields, "lapsed": lapsed, "renewed": self.renewed})
        callback = self.on_elected if leader else self.on_lost
        if callback is not None:
            try:
                callback()
            except Exception:
                logger.exception("leader_callback_failed", extra={"lease": self.name})

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll()
            if self._leader:
                # Renew; wake up in time to notice a lapse too (the store unreachable).
                remaining = max(self._valid_until - time.monotonic(), 0.0) + 0.01
                self._stop.wait(min(self.ttl_ms / 3000, remaining))
            else:
                self._stop.wait(self.ttl_ms / 10_000)
