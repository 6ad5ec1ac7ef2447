"""Each worker process tells the state store it is alive, for the operators' dashboard.

Every ``interval`` seconds a worker process writes its record (:mod:`jobsystem.store.heartbeats`):
host, pid, the queues it consumes, its threads and how many are running a job right now, the
jobs it finished, when it started, the project's and Dramatiq's versions. A clean stop writes
``stopped_at``; a process that dies just stops beating, and the dashboard shows it gone.

A beat never blocks a job: it is written from a thread of its own, and a store that does not
answer only delays the next one (logged once per outage). Senders (an application, ``jobctl``)
build the same middleware but never boot a worker, so they never beat.

It also declares the actor option ``dashboard_args``: an actor whose arguments may be shown to
operators (scrubbed) opts in with ``@dramatiq.actor(dashboard_args=True)``, and the Status
middleware then records them at send. Declared here, in a middleware every stack has, so the
option never makes an actor undeclarable when job status is turned off.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from importlib import metadata
from typing import Any

import dramatiq
from dramatiq.broker import Broker, MessageProxy
from dramatiq.common import q_name
from dramatiq.middleware import Middleware

from jobsystem.privacy.outage_lines import log_outage
from jobsystem.store.base import StateStore, StoreUnavailable
from jobsystem.store.heartbeats import HeartbeatBackend, heartbeat_backend

__all__ = ["Heartbeat"]

logger = logging.getLogger(__name__)

#: How long a stopped worker waits for its final record (and a beat in flight before it) to be written.
JOIN_TIMEOUT_S = 5.0


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "unknown"


class Heartbeat(Middleware):
    """Write this worker process's record to the state store every ``interval`` seconds.

    Parameters:
      store: the shared state store.
      interval: seconds between beats (the dashboard shows a worker gone after three missed).
    """

    def __init__(self, store: StateStore, *, interval: float = 5.0) -> None:
        self.store = store
        self.interval = interval
        self.backend: HeartbeatBackend = heartbeat_backend(store)
        # No lock on the job path: each worker thread writes only its own entries (a set's add
        # and discard, and a dict item, are atomic under the GIL); the beat reads a copy.
        self._running: set[int] = set()
        self._done: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._worker: dramatiq.Worker | None = None
        self._record: dict[str, Any] = {}
        self._failing = False
        #: Whether the final record (``stopped_at``) was written, by the one writer of the moment.
        self._stop_recorded = False

    @property
    def actor_options(self) -> set[str]:
        return {"dashboard_args"}

    @property
    def worker_id(self) -> str:
        return f"{self._record.get('host')}:{self._record.get('pid')}"

    # -- hooks -----------------------------------------------------------------------------------

    def after_worker_boot(self, broker: Broker, worker: dramatiq.Worker) -> None:
        self._worker = worker
        self._record = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "threads": worker.worker_threads,
            "started_at": int(time.time() * 1000),
            "version": _version("jobsystem"),
            "dramatiq": _version("dramatiq"),
        }
        self._stop.clear()
        self._stop_recorded = False
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self._thread.start()

    def before_worker_shutdown(self, broker: Broker, worker: dramatiq.Worker) -> None:
        # Only a signal: the beat thread writes the final record itself, after any beat in flight
        # (which would otherwise hide ``stopped_at``). Waiting here for the store would hold back
        # every later middleware's hook, ShutdownNotifications' notice to the running jobs included.
        self._stop.set()

    def after_worker_shutdown(self, broker: Broker, worker: dramatiq.Worker) -> None:
        # The thread is a daemon: let it write the final record before the process exits (bounded:
        # a store that hangs only delays the exit; the thread, still alive, stays the one writer).
        thread = self._thread
        started = thread is not None and thread.ident is not None  # join() refuses one never started
        if thread is not None and started:
            thread.join(JOIN_TIMEOUT_S)
            if thread.is_alive():
                return
        if self._record and not self._stop_recorded:
            # The thread died (killed by a BaseException), never started, or found the
            # store unavailable: no beat can follow, so the stop is written here, or the worker
            # would be shown gone instead of stopped.
            logger.warning("heartbeat_stop_from_shutdown", extra={"thread_started": started})
            self._record_stop()

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        self._running.add(threading.get_ident())

    def after_process_message(
        self,
        broker: Broker,
        message: MessageProxy,
        *,
        result: Any | None = None,
        exception: BaseException | None = None,
    ) -> None:
        ident = threading.get_ident()
        self._running.discard(ident)
        self._done[ident] = self._done.get(ident, 0) + 1

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        self._running.discard(threading.get_ident())

    # -- beating ---------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The record as it stands: the fixed fields, the queues consumed now, the counters."""
        consumers = list(self._worker.consumers) if self._worker is not None else []
        busy, done = len(self._running), sum(list(self._done.values()))
        queues = sorted({q_name(q) for q in consumers})
        return {**self._record, "queues": queues, "busy": busy, "jobs_done": done}

    def _beat(self, **extra: Any) -> bool:
        """Write the record; False when the store is unavailable (logged once per outage)."""
        now = int(time.time() * 1000)
        try:
            self.backend.beat(self.worker_id, {**self.snapshot(), **extra}, now)
        except StoreUnavailable as exc:
            if not self._failing:
                log_outage(logger, logging.WARNING, "heartbeat_failed", exc)
            self._failing = True
            return False
        self._failing = False
        return True

    def _record_stop(self) -> None:
        """The last word: ``stopped_at``. Called by the one writer (the thread, else the shutdown)."""
        self._stop_recorded = self._beat(stopped_at=int(time.time() * 1000))

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._beat()
            except Exception:  # a bug, not the store's outage: one beat lost, not the thread
                logger.exception("heartbeat_beat_error")
            self._stop.wait(self.interval)
        self._record_stop()
