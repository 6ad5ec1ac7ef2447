"""Stopping a running job: one thread per worker process polls the store for cancellation marks.

Every worker thread registers the message it runs (:meth:`RunningJobs.started`) and removes it
when the actor returns (:meth:`RunningJobs.ended`). The poller asks the store, in one batched call
every ``interval`` seconds, which of the running message ids are marked cancelled, and raises
:class:`JobCancelled` in the threads running them, as Dramatiq's time limit raises
``TimeLimitExceeded``. A registration and the raise happen under one lock, so the exception is
never aimed at a thread that already moved on to another message.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from jobsystem.dramatiq_internals import Interrupt, raise_in_thread
from jobsystem.store.base import StoreUnavailable

__all__ = ["CANCELLED", "JobCancelled", "RunningJobs"]

logger = logging.getLogger(__name__)

#: Message option a middleware sets on a message it skips because it was cancelled.
CANCELLED = "cancelled"


class JobCancelled(Interrupt):
    """Raised in a job's thread once it was cancelled (``actors.workflows.cancel``). A
    ``BaseException``, so ``except Exception`` in an actor does not swallow it; an actor may catch
    it to clean up, and should then re-raise it."""


class RunningJobs:
    """The interruptible jobs running in this process, and the thread that cancels them.

    Parameters:
      cancelled_among: which of the given message ids are marked cancelled (one store call).
      interval: seconds between two polls.
    """

    def __init__(self, cancelled_among: Callable[[list[str]], set[str]], *, interval: float = 0.5) -> None:
        self.cancelled_among = cancelled_among
        self.interval = interval
        self._running: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def started(self, message_id: str) -> None:
        """The calling thread runs ``message_id`` now (the poller starts with the first job)."""
        with self._lock:
            self._running[message_id] = threading.get_ident()
            if self._thread is None:
                self._thread = threading.Thread(target=self._poll, name="job-cancellation", daemon=True)
                self._thread.start()

    def ended(self, message_id: str) -> None:
        """The calling thread's job ``message_id`` returned or raised: it can no longer be interrupted."""
        with self._lock:
            if self._running.get(message_id) == threading.get_ident():
                del self._running[message_id]

    def stop(self) -> None:
        self._stop.set()

    def poll_once(self) -> list[str]:
        """Ask the store once; interrupt the cancelled jobs. Returns their ids."""
        with self._lock:
            ids = list(self._running)
        if not ids:
            return []
        try:
            marked = self.cancelled_among(ids)
        except StoreUnavailable as exc:
            logger.warning("cancellation_check_failed", extra={"error": str(exc)})
            return []
        hit = []
        with self._lock:
            for message_id in marked:
                thread_id = self._running.pop(message_id, None)
                if thread_id is not None:
                    raise_in_thread(thread_id, JobCancelled)
                    hit.append(message_id)
        for message_id in hit:
            logger.info("job_interrupted", extra={"message_id": message_id})
        return hit

    def _poll(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.poll_once()
            except Exception:  # keep polling whatever happens
                logger.exception("cancellation_poll_failed")
