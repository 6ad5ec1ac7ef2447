"""Metrics: Prometheus counters and timings of a worker group, under Dramatiq's own metric names.

Unlike Dramatiq's ``Prometheus`` middleware, each worker group keeps its sample files in a
directory of its own (``<directory>/group-<pid of the dramatiq main process>``, those of dead
groups removed at boot, and ``jobctl worker`` empties its own before it becomes that process)
instead of one never-cleared folder; host and port are constructor arguments, not environment
variables read at import; only Retries' re-enqueue of a failed attempt counts as a retry
(:mod:`jobsystem.runtime.attempts`), with skips and deferrals counted apart; and a queue or actor
the broker does not know is labelled ``unknown``. prometheus_client's multiprocess mode is
switched on in ``after_process_boot``, before the library is used. Worker threads add to a
:class:`~jobsystem.runtime.tally.Tally`, applied to the sample files every ``flush_interval``
seconds and at shutdown, instead of four sample writes per job. The ``/metrics`` endpoint is a
Dramatiq fork process (:mod:`jobsystem.observability.metrics`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dramatiq
from dramatiq import Message
from dramatiq.broker import Broker, MessageProxy
from dramatiq.common import q_name
from dramatiq.middleware import Middleware

from jobsystem.dramatiq_internals import wants_redelivery
from jobsystem.runtime.actor_names import UNKNOWN_ACTOR, actor_label
from jobsystem.runtime.attempts import AttemptTracker
from jobsystem.runtime.tally import Tally

__all__ = ["DURATION_BUCKETS", "Metrics", "group_directory"]

logger = logging.getLogger(__name__)

#: Dramatiq's buckets (milliseconds), and 30 minutes for long jobs.
DURATION_BUCKETS: tuple[float, ...] = (5, 10, 25, 50, 75, 100, 250, 500, 750, 1_000, 2_500, 5_000, 7_500)
DURATION_BUCKETS += (10_000, 30_000, 60_000, 600_000, 900_000, 1_800_000, float("inf"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def group_directory(base: Path, main_pid: int | None = None) -> Path:
    """The sample directory of the worker group whose ``dramatiq`` main process is ``main_pid``
    (default: this process's parent, as for a worker process)."""
    return base / f"group-{os.getppid() if main_pid is None else main_pid}"


def _remove_dead_groups(base: Path) -> None:
    for path in base.glob("group-*"):
        suffix = path.name.removeprefix("group-")
        if suffix.isdigit() and not _alive(int(suffix)):
            shutil.rmtree(path, ignore_errors=True)


class _Instruments:
    """The metrics of one worker process, created once multiprocess mode is on."""

    def __init__(self) -> None:
        import prometheus_client as prom

        labels = ["queue_name", "actor_name"]
        registry = prom.CollectorRegistry()  # the exposition process collects from the files
        self.processed = prom.Counter(
            "dramatiq_messages", "Messages processed (the actor ran).", labels, registry=registry
        )
        self.errors = prom.Counter(
            "dramatiq_message_errors", "Attempts that raised.", labels, registry=registry
        )
        self.retries = prom.Counter(
            "dramatiq_message_retries", "Failed attempts re-enqueued by Retries.", labels, registry=registry
        )
        self.rejects = prom.Counter(
            "dramatiq_message_rejects", "Messages dead-lettered (failed for good).", labels, registry=registry
        )
        self.skipped = prom.Counter(
            "jobs_messages_skipped", "Messages skipped without running.", labels, registry=registry
        )
        self.deferred = prom.Counter(
            "jobs_messages_deferred",
            "Messages re-enqueued with a delay before running.",
            labels,
            registry=registry,
        )
        self.in_progress = prom.Gauge(
            "dramatiq_messages_inprogress",
            "Messages being processed.",
            labels,
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.durations = prom.Histogram(
            "dramatiq_message_duration_milliseconds",
            "Time spent in the actor.",
            labels,
            buckets=DURATION_BUCKETS,
            registry=registry,
        )


#: The label of a queue or an actor the broker does not know: names from a message body (anyone
#: who may publish) would add series without bound, and could carry personal data.
UNKNOWN = UNKNOWN_ACTOR


def _labels(broker: Broker, message: Message[Any] | MessageProxy) -> tuple[str, str]:
    """The queue and actor labels of ``message``: names declared on ``broker``, else UNKNOWN."""
    queue, actor = q_name(message.queue_name), message.actor_name
    return (queue if queue in broker.queues else UNKNOWN, actor_label(actor, broker.actors))


class Metrics(Middleware):
    """Count processed, failed, retried, dead, skipped and deferred messages and time the actors.

    Parameters:
      directory: where worker groups keep their sample files (one subdirectory per group).
      exposition: the function Dramatiq forks to serve ``/metrics`` (it must be importable by
        module and name, and build its configuration itself); None serves nothing.
      flush_interval: seconds between two applications of the counts gathered in-process (a
        scrape lags the jobs by at most this).

    Place it last in the stack: its ``before_process_message`` then runs just before the actor,
    and its ``after_process_message`` before Retries decides about a failed attempt. In a process
    that is not a ``dramatiq`` worker (an application sending messages) it does nothing.
    """

    def __init__(
        self, directory: Path, *, exposition: Callable[[], int] | None = None, flush_interval: float = 1.0
    ) -> None:
        self.directory = directory
        self.exposition = exposition
        self.tally = Tally(flush_interval)
        self.attempts = AttemptTracker()
        self._instruments: _Instruments | None = None
        self._local = threading.local()

    @property
    def forks(self) -> list[Callable[[], int]]:
        return [self.exposition] if self.exposition is not None else []

    def after_process_boot(self, broker: Broker) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        _remove_dead_groups(self.directory)
        group = group_directory(self.directory)
        group.mkdir(exist_ok=True)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(group)
        from prometheus_client import values

        if not getattr(values.ValueClass, "_multiprocess", False):
            # Something imported prometheus_client before the variable was set: switch it now.
            values.ValueClass = values.MultiProcessValue()  # type: ignore[no-untyped-call]
        self._instruments = _Instruments()
        self.tally.start()

    def after_worker_boot(self, broker: Broker, worker: dramatiq.Worker) -> None:
        if self._instruments is None:
            return
        only = worker.consumer_whitelist
        queues = sorted(q for q in broker.get_declared_queues() if not only or q in only)
        path = group_directory(self.directory) / f"queues-{os.getpid()}.json"
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(queues))
        partial.replace(path)

    def after_worker_shutdown(self, broker: Broker, worker: dramatiq.Worker) -> None:
        if self._instruments is None:
            return
        from prometheus_client import multiprocess

        self.tally.stop()
        group = group_directory(self.directory)
        multiprocess.mark_process_dead(os.getpid(), str(group))  # type: ignore[no-untyped-call]
        (group / f"queues-{os.getpid()}.json").unlink(missing_ok=True)

    def after_enqueue(self, broker: Broker, message: Message[Any], delay: int | None) -> None:
        if self._instruments is not None and self.attempts.enqueued(message, delay) == "retry":
            self.tally.count(self._instruments.retries, _labels(broker, message))

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        if self._instruments is not None:
            self._local.started = (message.message_id, time.monotonic())
            self.tally.level(self._instruments.in_progress, _labels(broker, message), 1)

    def _started(self, message: MessageProxy) -> float | None:
        """When this thread started ``message`` (monotonic seconds), forgotten once asked; None
        when it did not start it."""
        started: tuple[str, float] | None = getattr(self._local, "started", None)
        self._local.started = None
        if started is None or started[0] != message.message_id:
            return None
        return started[1]

    def _finish(self, broker: Broker, message: MessageProxy) -> None:
        """A job that ends without running: out of the in-progress level if it entered it."""
        if self._started(message) is not None:
            assert self._instruments is not None
            self.tally.level(self._instruments.in_progress, _labels(broker, message), -1)

    def after_process_message(
        self,
        broker: Broker,
        message: MessageProxy,
        *,
        result: Any | None = None,
        exception: BaseException | None = None,
    ) -> None:
        if self._instruments is None:
            return
        instruments, labels = self._instruments, _labels(broker, message)
        started = self._started(message)
        if started is not None:  # one lock acquisition for the level, the duration and the count
            duration = (time.monotonic() - started) * 1000
            self.tally.finished(
                labels,
                gauge=instruments.in_progress,
                histogram=instruments.durations,
                value=duration,
                counter=instruments.processed,
            )
        else:
            self.tally.count(instruments.processed, labels)
        if exception is not None:
            self.tally.count(instruments.errors, labels)
            self.attempts.failed(message.message_id)

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        if self._instruments is None:
            return
        self._finish(broker, message)
        if self.attempts.deferred(message.message_id) or wants_redelivery(message):
            self.tally.count(self._instruments.deferred, _labels(broker, message))
        elif not message.failed:
            self.tally.count(self._instruments.skipped, _labels(broker, message))

    def after_nack(self, broker: Broker, message: MessageProxy) -> None:
        self.attempts.done()
        if self._instruments is not None and not wants_redelivery(message):  # counted once published
            self.tally.count(self._instruments.rejects, _labels(broker, message))

    def after_ack(self, broker: Broker, message: MessageProxy) -> None:
        self.attempts.done()
