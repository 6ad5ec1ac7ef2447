"""Claims sent ahead at receipt, so that a prefetched message's claim round trip overlaps its wait
for a worker thread instead of adding to its run."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from dramatiq.broker import MessageProxy

from jobsystem.dramatiq_internals import send_claim_ahead, take_claim_ahead
from jobsystem.runtime.coalesce import Coalescer
from jobsystem.runtime.dispatch_gate import DispatchGate
from jobsystem.store.base import StoreUnavailable
from jobsystem.store.idempotency import Claim, ClaimRequest

__all__ = ["FRESH_S", "Ahead", "ClaimsAhead"]

#: How recent the store's word must be for a job to start on a claim sent ahead: either the answer
#: itself, or (for a granted or completed claim) some later claim answered by the store.
FRESH_S = 0.1


@dataclass
class Ahead:
    """A claim sent ahead for one delivery: what was asked, its pending answer, and when."""

    request: ClaimRequest
    pending: Any
    sent_at: float


class ClaimsAhead:
    """The claims sent ahead for deliveries that have not started yet.

    Parameters:
      claims: the coalescer the claims go through (shared with the claims made at start).
      lease_ms: the lease a granted claim holds; renewed every third of it once the job starts.

    How long an answer is trusted. An answer younger than :data:`FRESH_S` always is. A granted
    claim is this worker's until its lease runs out, so it stays good while the message waits in
    the prefetch buffer, however long that is under load, provided the renewal that starts with the
    job comes in time (the renewer runs every third of the lease: an answer younger than a third of
    the lease leaves a third of it to spare) and the store is still there: some claim was answered
    within the last :data:`FRESH_S` (under load, every few milliseconds), and none has failed since
    the answer. A "completed" answer is final (only the key's TTL ends it) and is trusted alike. A
    "held" answer is trusted :data:`FRESH_S` only (the holder may finish at any moment). Otherwise
    the message is claimed again at start, failing closed if the store does not answer.
    """

    def __init__(self, claims: Coalescer[ClaimRequest, Claim], lease_ms: int) -> None:
        self.claims = claims
        self.trusted_s = lease_ms / 3000
        #: When the store last answered a batch of claims.
        self.store_answered_at = float("-inf")
        self._unstarted: dict[tuple[str, str], Ahead] = {}
        self._lock = threading.Lock()
        #: When a claim last found the store unreachable: a claim sent ahead before it is redone.
        self.store_failed_at = float("-inf")

    def send(self, message: MessageProxy, request: ClaimRequest, gate: DispatchGate | None = None) -> None:
        """Send ``request`` for ``message`` without waiting for the answer; with a ``gate``, the
        delivery is held back from the worker threads until the answer is in."""
        release = gate.hold() if gate is not None else None
        try:
            pending = self.claims.submit(request, on_done=release)
        except BaseException:
            if release is not None:
                release()
            raise
        ahead = Ahead(request, pending, time.monotonic())
        with self._lock:
            self._unstarted[(request.message_id, request.owner)] = ahead
        send_claim_ahead(message, ahead)

    def take(self, message: MessageProxy) -> Ahead | None:
        """The claim sent ahead for ``message``, taken off it (its answer is collected once) and
        no longer to be given back at shutdown."""
        ahead = take_claim_ahead(message)
        if not isinstance(ahead, Ahead):
            return None
        with self._lock:
            self._unstarted.pop((ahead.request.message_id, ahead.request.owner), None)
        return ahead

    def dropped(self, message: MessageProxy) -> ClaimRequest | None:
        """The claim sent ahead for a delivery dropped before it started, once answered (the
        consumer drops a held delivery when the answer is in): to be given back if granted (or
        unknown), else None. It is taken off, so a stop does not give it back again."""
        ahead = self.take(message)
        return ahead.request if ahead is not None and self.granted(ahead, timeout=0) else None

    def answer(self, ahead: Ahead | None) -> tuple[str | None, Claim | None]:
        """The owner of the claim sent ahead (as :meth:`take` gave it), and its answer if it can
        still be trusted (see the class's docstring; else None: claim again, as the same owner)."""
        if ahead is None:
            return None, None
        try:
            claim = self.claims.wait(ahead.pending)
        except StoreUnavailable:
            return ahead.request.owner, None
        now = time.monotonic()
        age = now - ahead.sent_at
        store_seen = now - self.store_answered_at < FRESH_S
        fresh = age < FRESH_S or (claim.status != "held" and age < self.trusted_s and store_seen)
        trusted = self.store_failed_at < ahead.sent_at
        return ahead.request.owner, claim if fresh and trusted else None

    def granted(self, ahead: Ahead, timeout: float | None = None) -> bool:
        """Whether the claim sent ahead was granted (so there is a lease to give back), once its
        answer is in (waiting up to ``timeout`` seconds); an answer that is unknown or not in by
        then counts as granted, to be given back in case."""
        try:
            return self.claims.wait(ahead.pending, timeout).status == "claimed"
        except (StoreUnavailable, TimeoutError):
            return True

    def unstarted(self, timeout: float) -> list[ClaimRequest]:
        """The claims sent ahead for deliveries that never started, to be given back (those
        granted, or whose answer is unknown); all are forgotten from now on.

        Each answer is awaited first, up to ``timeout`` seconds for them all: a claim still queued
        in the coalescer behind another batch would otherwise be granted after it was given back,
        and hold its key until its lease ran out.
        """
        with self._lock:
            unstarted, self._unstarted = list(self._unstarted.values()), {}
        deadline = time.monotonic() + timeout
        return [ahead.request for ahead in unstarted if self.granted(ahead, deadline - time.monotonic())]
