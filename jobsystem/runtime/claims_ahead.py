"""Claims made at receipt, for a whole burst of deliveries in one store call, so that the claims of a
burst share one round trip (the issue's "one admission per job, batched across the deliveries
prefetched"), and a keyed job's worker thread finds its claim sent, and its answer on the way or
already there, when it takes the job.

A burst of one delivery (an idle worker's) is handed out without waiting for its answer: the store's
round trip then overlaps the hand-off to a worker thread and the hooks before Idempotency's, and the
first thread that needs the answer reads it. A larger burst (a busy worker's) is answered before
any of it is handed out: the worker threads taking its deliveries at once would otherwise wait on
each other for the one answer (measured: 15-25% more worker CPU per keyed job). The consumer does
not read a burst of one's answer itself: once its worker thread runs the job's hooks, the consumer
reading the answer meanwhile held the answer's lock while it waited for the GIL, and the worker
thread then waited for the consumer (traced: 0.1 ms more at Idempotency's hook)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from dramatiq.broker import MessageProxy

from jobsystem.dramatiq_internals import send_claim_ahead, take_claim_ahead
from jobsystem.store.idempotency import Claim, ClaimRequest, IdempotencyBackend, failed_claims

__all__ = ["FRESH_S", "Ahead", "ClaimsAhead"]

#: How recent the store's word must be for a job to start on a claim made ahead: either the answer
#: itself, or (for a granted or completed claim) some later claim answered by the store.
FRESH_S = 0.1


class _Burst:
    """The answers to one burst's claims, read once, by the first thread that needs one."""

    __slots__ = ("_answers", "_lock", "_owner", "_reply", "count", "sent_at")

    def __init__(
        self, owner: ClaimsAhead, reply: Callable[[], list[Claim]], count: int, sent_at: float
    ) -> None:
        self._owner, self._reply, self.count, self.sent_at = owner, reply, count, sent_at
        self._answers: list[Claim | None] | None = None
        self._lock = threading.Lock()

    @property
    def answered(self) -> bool:
        """Whether the answers have been read (or given up on)."""
        return self._answers is not None

    def answers(self) -> list[Claim | None]:
        """The answers, in order (each None where the call failed: granted or not, unknown)."""
        with self._lock:
            if self._answers is None:
                self._answers = [None] * self.count  # kept as they are if the read is interrupted
                self._answers = self._owner.read(self._reply, self.sent_at, self.count)
            return self._answers


@dataclass(slots=True)
class Ahead:
    """A claim made ahead for one delivery: what was asked, the burst it was asked with (and its
    place in it), and when."""

    request: ClaimRequest
    burst: _Burst
    index: int

    @property
    def sent_at(self) -> float:
        return self.burst.sent_at

    @property
    def claim(self) -> Claim | None:
        """The answer, read if no thread has yet (None: the call failed, and the claim may or may
        not have been granted)."""
        return self.burst.answers()[self.index]


class ClaimsAhead:
    """The claims made ahead for deliveries that have not started yet.

    Parameters:
      backend: the keys' store operations; its ``send_claims`` sends many requests in one store
        call, in order, and returns what reads the answers (raising
        :class:`~jobsystem.store.base.StoreUnavailable` when the store cannot answer).
      lease_ms: the lease a granted claim holds; renewed every third of it once the job starts.
      pause_after_failure_s: how long after a failed call no claim is made ahead: the receiving
        thread would wait on a store that is down, and each job claims at its start anyway.

    How long an answer is trusted. An answer younger than :data:`FRESH_S` always is. A granted
    claim is this worker's until its lease runs out, so it stays good while the message waits in
    the prefetch buffer, however long that is under load, provided the renewal that starts with the
    job comes in time (the renewer runs every third of the lease: an answer younger than a third of
    the lease leaves a third of it to spare) and the store is still there: some claim was answered
    within the last :data:`FRESH_S` (under load, every few milliseconds), and none has failed since
    the answer. A "completed" answer is final (only the key's TTL ends it) and is trusted alike. A
    "held" answer is trusted :data:`FRESH_S` only (the holder may finish at any moment). Otherwise
    the message is claimed again at start, as the same owner, failing closed if the store does not
    answer.
    """

    def __init__(
        self,
        backend: IdempotencyBackend,
        lease_ms: int,
        *,
        pause_after_failure_s: float = 4.0,
    ) -> None:
        self.backend = backend
        self.trusted_s = lease_ms / 3000
        self.pause_after_failure_s = pause_after_failure_s
        #: When the store last answered a batch of claims.
        self.store_answered_at = float("-inf")
        #: When a claim last found the store unreachable: a claim made ahead before it is redone.
        self.store_failed_at = float("-inf")
        self._unstarted: dict[tuple[str, str], Ahead] = {}
        self._lock = threading.Lock()

    def send(self, claims: list[tuple[MessageProxy, ClaimRequest]]) -> None:
        """Send the claims of each ``(message, request)`` in one store call and keep the claim on
        its message, unless the store failed within the pause (then each job claims at its
        start). The answers are read later (:meth:`read`)."""
        sent_at = time.monotonic()
        if sent_at - self.store_failed_at < self.pause_after_failure_s:
            return
        try:
            reply = self.backend.send_claims([request for _, request in claims])
        except Exception as exc:  # unforeseen (the store's errors come with the reply)
            reply = failed_claims(exc)
        burst = _Burst(self, reply, len(claims), sent_at)
        with self._lock:
            for index, (message, request) in enumerate(claims):
                ahead = Ahead(request, burst, index)
                self._unstarted[(request.message_id, request.owner)] = ahead
                send_claim_ahead(message, ahead)
        if len(claims) > 1:  # a busy worker: answered before any is handed out (see the module)
            burst.answers()

    def read(self, reply: Callable[[], list[Claim]], sent_at: float, count: int) -> list[Claim | None]:
        """A burst's answers from ``reply``. One that fails (the store's error, a reply of the
        wrong shape) leaves each claim an unknown answer: its job claims again, as the same owner,
        and no claim is made ahead for a while. The store answered after ``sent_at``: that is
        when it is known to have been there."""
        try:
            answers: list[Claim | None] = list(reply())
            if len(answers) != count:
                raise ValueError(f"{len(answers)} answers to {count} claims")
        except Exception:
            self.store_failed_at = time.monotonic()
            return [None] * count
        self.store_answered_at = max(self.store_answered_at, sent_at)
        return answers

    def take(self, message: MessageProxy) -> Ahead | None:
        """The claim made ahead for ``message``, taken off it (its answer is used once) and no
        longer to be given back at shutdown."""
        ahead = take_claim_ahead(message)
        if not isinstance(ahead, Ahead):
            return None
        with self._lock:
            self._unstarted.pop((ahead.request.message_id, ahead.request.owner), None)
        return ahead

    def dropped(self, message: MessageProxy) -> ClaimRequest | None:
        """The claim made ahead for a delivery dropped before it started: to be given back if
        granted (or unknown), else None. It is taken off, so a stop does not give it back again."""
        ahead = self.take(message)
        return ahead.request if ahead is not None and self.granted(ahead) else None

    def answer(self, ahead: Ahead | None) -> tuple[str | None, Claim | None]:
        """The owner of the claim made ahead (as :meth:`take` gave it), and its answer if it can
        still be trusted (see the class's docstring; else None: claim again, as the same owner)."""
        if ahead is None:
            return None, None
        claim = ahead.claim
        if claim is None:
            return ahead.request.owner, None
        now = time.monotonic()
        age = now - ahead.sent_at
        store_seen = now - self.store_answered_at < FRESH_S
        fresh = age < FRESH_S or (claim.status != "held" and age < self.trusted_s and store_seen)
        trusted = self.store_failed_at < ahead.sent_at
        return ahead.request.owner, claim if fresh and trusted else None

    @staticmethod
    def granted(ahead: Ahead) -> bool:
        """Whether the claim made ahead holds a lease to give back: granted, or unknown (given
        back in case)."""
        return ahead.claim is None or ahead.claim.status == "claimed"

    def unstarted(self) -> list[ClaimRequest]:
        """The claims made ahead for deliveries that never started, to be given back (those
        granted, or whose answer is unknown); all are forgotten from now on."""
        with self._lock:
            unstarted, self._unstarted = list(self._unstarted.values()), {}
        return [ahead.request for ahead in unstarted if self.granted(ahead)]
