"""Replace a worker's threads that died, so a process never stays up with no thread to run jobs.

Dramatiq starts its worker and consumer threads once. A worker thread dies when an exception
escapes ``process_message``: its ``finally`` block looks the message's consumer up by queue name,
and its ``except`` block reads options and logs; a ``BaseException`` from an ``after_*`` hook (an
asynchronous interrupt landing there) escapes too. The consumer checks each message's shape so
none of that should happen (``jobsystem.runtime.message_shape``), but if a thread dies anyway the
process would stay up, consuming nothing or running nothing, until someone notices.

:class:`ThreadWatchdog` looks at the worker's threads every ``interval`` seconds from its own
daemon thread and starts a replacement for each one that died while it was meant to be running,
logging ``worker_thread_replaced`` at ERROR (an alert through Sentry's logging integration). It
stops looking when the worker starts shutting down, before Dramatiq stops the threads itself.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import dramatiq
from dramatiq.broker import Broker
from dramatiq.middleware import Middleware

from jobsystem.dramatiq_internals import ConsumerThread, add_worker_thread

__all__ = ["ThreadWatchdog"]

logger = logging.getLogger(__name__)


def _died(thread: Any) -> bool:
    """A thread that was started, is meant to run (``running`` is cleared only by ``stop()``),
    and is not alive any more."""
    return bool(getattr(thread, "running", False)) and thread.ident is not None and not thread.is_alive()


class ThreadWatchdog(Middleware):
    """Replaces dead worker and consumer threads of the worker it is booted with.

    Parameters:
      interval: seconds between two looks at the threads.
    """

    def __init__(self, *, interval: float = 1.0) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def after_worker_boot(self, broker: Broker, worker: dramatiq.Worker) -> None:
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._watch, args=(worker,), name="thread-watchdog", daemon=True
        )
        self._thread.start()

    def before_worker_shutdown(self, broker: Broker, worker: dramatiq.Worker) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, self.interval * 2))

    def _watch(self, worker: dramatiq.Worker) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.replace_dead(worker)
            except Exception:  # never let the watchdog itself die quietly
                logger.exception("thread_watchdog_failed")

    def replace_dead(self, worker: dramatiq.Worker) -> int:
        """Start a replacement for each thread of ``worker`` that died; returns how many."""
        replaced = 0
        for dead in [t for t in worker.workers if _died(t)]:
            if self._stop.is_set():
                return replaced
            worker.workers.remove(dead)
            add_worker_thread(worker)
            replaced += 1
            logger.error("worker_thread_replaced", extra={"kind": "worker", "thread_name": dead.name})
        for queue_name, consumer in list(worker.consumers.items()):
            if self._stop.is_set() or not _died(consumer):
                continue
            self._replace_consumer(worker, queue_name, consumer)
            replaced += 1
        return replaced

    @staticmethod
    def _replace_consumer(worker: dramatiq.Worker, queue_name: str, dead: ConsumerThread) -> None:
        # The dead thread's connection holds its unacked deliveries: closing it hands them back
        # to RabbitMQ, which redelivers them to the replacement.
        try:
            dead.close()
        except Exception:
            logger.warning("dead_consumer_close_failed", extra={"queue": queue_name}, exc_info=True)
        replacement = ConsumerThread(
            broker=dead.broker,
            queue_name=queue_name,
            prefetch=dead.prefetch,
            work_queue=dead.work_queue,
            worker_timeout=dead.worker_timeout,
        )
        worker.consumers[queue_name] = replacement
        replacement.start()
        logger.error(
            "worker_thread_replaced",
            extra={"kind": "consumer", "queue": queue_name, "thread_name": dead.name},
        )
