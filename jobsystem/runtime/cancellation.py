"""What a worker process knows of cancellations: one thread polls the store, jobs ask it locally.

Asking the store on every message's arrival would cost a round trip per job. Instead one thread
per worker process asks, every ``interval`` seconds and in one call, for the marks made since its
last poll (:meth:`CancelWatch.poll_once`), keeps them, and raises :class:`JobCancelled` in the
threads running a marked job, as Dramatiq's time limit raises ``TimeLimitExceeded``. A message
arriving is checked against what the poller knows (:meth:`CancelWatch.known`); while the poller
is not up to date (not started yet, or the store not answering) the answer is None and the caller
asks the store itself, so nothing runs unchecked. A job cancelled less than one poll before it
arrives starts, and is interrupted at the next poll.

A mark is a message id (stopped wherever it runs) or a (message id, workflow id) pair, written
by a workflow's cancel: it stops the message as that workflow's member only, so a job is asked
about with its workflow's id too (None when it is no member; that costs one comparison).

Every worker thread registers the message it runs and its workflow (:meth:`CancelWatch.started`,
or on arrival with :meth:`CancelWatch.arrived`) and removes it when the actor returns
(:meth:`CancelWatch.ended`), under the lock the raise takes, so the exception is never aimed at a
thread that moved on to another message. Jobs are registered by thread: two threads may run the
same message at once, as members of two workflows, and only the cancelled one is interrupted.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from jobsystem.dramatiq_internals import Interrupt, raise_in_thread
from jobsystem.privacy.outage_lines import log_outage
from jobsystem.store.base import StoreUnavailable
from jobsystem.store.cancel_marks import Mark

__all__ = ["CANCELLED", "CancelWatch", "JobCancelled"]

logger = logging.getLogger(__name__)

#: Message option a middleware sets on a message it skips because it was cancelled.
CANCELLED = "cancelled"

#: Each poll asks again for the marks of this many milliseconds before the last one's time, so a
#: mark written just as the last poll read is not missed.
OVERLAP_MS = 5_000


class JobCancelled(Interrupt):
    """Raised in a job's thread once it was cancelled (``actors.workflows.cancel``). A
    ``BaseException``, so ``except Exception`` in an actor does not swallow it; an actor may catch
    it to clean up, and should then re-raise it."""


class CancelWatch:
    """The cancellation marks this process knows, and the interruptible jobs it runs.

    Parameters:
      cancelled_since: the marks made since a time (store clock, ms), each a message id or a
        (message id, workflow id) pair, and the store's time now.
      keep_ms: how long a mark is kept (the marks' TTL).
      interval: seconds between two polls.
      stale_after: seconds after the last successful poll when what is known no longer counts.
    """

    def __init__(
        self,
        cancelled_since: Callable[[int], tuple[dict[Mark, int], int]],
        *,
        keep_ms: int,
        interval: float = 0.5,
        stale_after: float = 3.0,
    ) -> None:
        self.cancelled_since = cancelled_since
        self.keep_ms = keep_ms
        self.interval = interval
        self.stale_after = stale_after
        self._marks: dict[Mark, int] = {}
        self._store_now: int | None = None
        self._pruned_at = 0
        self._polled_at = float("-inf")
        # Each running job's thread: its message id and workflow id (None: no workflow's member).
        self._running: dict[int, tuple[str, str | None]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the poller (once; a process that never runs a job starts none)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._poll, name="job-cancellation", daemon=True)
                self._thread.start()

    def known(self, message_id: str, workflow_id: str | None = None) -> bool | None:
        """Whether ``message_id`` (a member of ``workflow_id``, if given) is marked cancelled, as
        of the last poll; None when that poll is too old to count (ask the store)."""
        return self.arrived(message_id, workflow_id, start=False)

    def arrived(self, message_id: str, workflow_id: str | None = None, *, start: bool) -> bool | None:
        """:meth:`known`; and when the answer is False and ``start`` is true, :meth:`started` too,
        under the same lock acquisition (a job's arrival takes the lock once, not twice)."""
        if self._thread is None:  # start() checks again under the lock
            self.start()
        with self._lock:
            if time.monotonic() - self._polled_at > self.stale_after:
                return None
            if self._marked(message_id, workflow_id):
                return True
            if start:
                self._running[threading.get_ident()] = (message_id, workflow_id)
            return False

    def _marked(self, message_id: str, workflow_id: str | None) -> bool:
        """Whether a known mark stops ``message_id``: by id, or as ``workflow_id``'s member."""
        return message_id in self._marks or (
            workflow_id is not None and (message_id, workflow_id) in self._marks
        )

    def started(self, message_id: str, workflow_id: str | None = None) -> None:
        """The calling thread runs ``message_id`` (a member of ``workflow_id``, if given) now: it
        is interrupted if a mark that stops it comes."""
        with self._lock:
            self._running[threading.get_ident()] = (message_id, workflow_id)

    def ended(self, message_id: str) -> None:
        """The calling thread's job ``message_id`` returned or raised: it can no longer be interrupted."""
        with self._lock:
            ident = threading.get_ident()
            if ident in self._running and self._running[ident][0] == message_id:
                del self._running[ident]

    def stop(self) -> None:
        self._stop.set()

    def poll_once(self) -> list[str]:
        """Ask the store for new marks once; interrupt the running jobs marked. Returns their ids."""
        since = 0 if self._store_now is None else self._store_now - OVERLAP_MS
        try:
            marks, now = self.cancelled_since(since)
        except StoreUnavailable as exc:
            log_outage(logger, logging.WARNING, "cancellation_poll_failed", exc)
            return []
        hit = []
        with self._lock:
            self._marks.update(marks)
            if now - self._pruned_at > 60_000:  # forget expired marks once a minute
                self._marks = {i: at for i, at in self._marks.items() if at > now - self.keep_ms}
                self._pruned_at = now
            self._store_now, self._polled_at = now, time.monotonic()
            for ident in [i for i, job in self._running.items() if self._marked(*job)]:
                raise_in_thread(ident, JobCancelled)
                hit.append(self._running.pop(ident)[0])
        for message_id in hit:
            logger.info("job_interrupted", extra={"message_id": message_id})
        return hit

    def _poll(self) -> None:
        while True:
            try:
                self.poll_once()
            except Exception:  # keep polling whatever happens
                logger.exception("cancellation_poll_failed")
            if self._stop.wait(self.interval):
                return
