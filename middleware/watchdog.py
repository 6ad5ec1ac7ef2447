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

A dead thread's RabbitMQ connection is closed too. A consumer thread has one of its own, holding
its unacked deliveries; and worker and consumer threads alike open one of the broker's
(per thread, on their first publish or queue declaration) that only their thread would close.
Left open, each replacement left one more behind: in the broker's set of connections for the
life of the process, and in RabbitMQ until two heartbeats went unanswered (about two minutes with
``RABBITMQ_HEARTBEAT=60``; for good with heartbeats off).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import dramatiq
from dramatiq.broker import Broker
from dramatiq.middleware import Middleware

from jobsystem.dramatiq_internals import (
    ConsumerThread,
    add_worker_thread,
    close_ended_threads_connections,
)
from jobsystem.privacy.outage_lines import log_outage

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
        if replaced:
            self._close_connections_of_the_dead(worker.broker)
        return replaced

    @staticmethod
    def _close_connections_of_the_dead(broker: Broker) -> None:
        """Close the broker connections of threads that ended, the dead ones' among them: a dead
        thread cannot close its own."""
        closed = close_ended_threads_connections(broker)
        if closed:
            logger.info("dead_thread_connections_closed", extra={"connections": closed})

    @staticmethod
    def _replace_consumer(worker: dramatiq.Worker, queue_name: str, dead: ConsumerThread) -> None:
        # The dead thread's connection holds its unacked deliveries: closing it hands them back
        # to RabbitMQ, which redelivers them to the replacement.
        try:
            dead.close()
        except Exception as exc:  # pika's text may name RabbitMQ's host and port: by class here
            log_outage(logger, logging.WARNING, "dead_consumer_close_failed", exc, queue=queue_name)
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
