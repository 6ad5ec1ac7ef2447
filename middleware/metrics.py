"""Prometheus metrics of a worker group, and the HTTP server that exposes them.

The same metric names as Dramatiq's own ``dramatiq.middleware.prometheus`` (dashboards keep
working), with what its source shows fixed:

- Dramatiq keeps every worker group's sample files in one directory (``dramatiq_prom_db``, by
  default ``/tmp/dramatiq-prometheus``) that nothing clears in 2.x: counters of past runs and of
  other groups on the host are summed in. Here each group writes to ``<directory>/group-<pid of
  the dramatiq main process>``; directories of groups whose main process is gone are removed at boot.
- Its host and port are environment variables read at import; here they are constructor arguments.
- Its ``dramatiq_message_retries_total`` counts every enqueue carrying a ``retries`` option, so a
  retried message counts again when it moves from the delay queue, and deferrals count as retries.
  Here only Retries' re-enqueue of a failed attempt counts (:mod:`jobsystem.runtime.attempts`); skips and
  deferrals have counters of their own instead of counting as processed.

prometheus_client's multiprocess mode is chosen when it is imported (``PROMETHEUS_MULTIPROC_DIR``
in the environment); ``after_process_boot`` sets it and only then imports the library, as Dramatiq
does. The exposition server runs as a Dramatiq *fork* process (the ``forks`` property): one per
worker group, started by the ``dramatiq`` main process after the workers booted, reading every
worker's sample files; it also reports queue depths, asked from RabbitMQ at scrape time for the
queues the workers consume (each worker lists them in the group directory).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import dramatiq
from dramatiq import Message
from dramatiq.broker import Broker, MessageProxy
from dramatiq.common import q_name
from dramatiq.middleware import Middleware

from jobsystem.runtime.attempts import AttemptTracker
from middleware.dead_letters import wants_redelivery

logger = logging.getLogger(__name__)

#: Queue name -> {"waiting": n, "unacked": n, "delayed": n, "dead": n, "consumers": n}; None = unknown.
QueueDepths = Callable[[list[str]], dict[str, dict[str, int | None]]]

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


def group_directory(base: Path) -> Path:
    """The sample directory of this process's worker group (its parent is the ``dramatiq`` main process)."""
    return base / f"group-{os.getppid()}"


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


def _labels(message: Message[Any] | MessageProxy) -> tuple[str, str]:
    return q_name(message.queue_name), message.actor_name


class Metrics(Middleware):
    """Count processed, failed, retried, dead, skipped and deferred messages and time the actors.

    Parameters:
      directory: where worker groups keep their sample files (one subdirectory per group).
      exposition: the function Dramatiq forks to serve ``/metrics`` (it must be importable by
        module and name, and build its configuration itself); None serves nothing.

    Place it last in the stack: its ``before_process_message`` then runs just before the actor,
    and its ``after_process_message`` before Retries decides about a failed attempt. In a process
    that is not a ``dramatiq`` worker (an application sending messages) it does nothing.
    """

    def __init__(self, directory: Path, *, exposition: Callable[[], int] | None = None) -> None:
        self.directory = directory
        self.exposition = exposition
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

        group = group_directory(self.directory)
        multiprocess.mark_process_dead(os.getpid(), str(group))  # type: ignore[no-untyped-call]
        (group / f"queues-{os.getpid()}.json").unlink(missing_ok=True)

    def after_enqueue(self, broker: Broker, message: Message[Any], delay: int | None) -> None:
        if self._instruments is not None and self.attempts.enqueued(message, delay) == "retry":
            self._instruments.retries.labels(*_labels(message)).inc()

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        if self._instruments is not None:
            self._local.started = (message.message_id, time.monotonic())
            self._instruments.in_progress.labels(*_labels(message)).inc()

    def _finish(self, message: MessageProxy) -> float | None:
        started: tuple[str, float] | None = getattr(self._local, "started", None)
        self._local.started = None
        if started is None or started[0] != message.message_id:
            return None
        assert self._instruments is not None
        self._instruments.in_progress.labels(*_labels(message)).dec()
        return (time.monotonic() - started[1]) * 1000

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
        labels = _labels(message)
        duration = self._finish(message)
        if duration is not None:
            self._instruments.durations.labels(*labels).observe(duration)
        self._instruments.processed.labels(*labels).inc()
        if exception is not None:
            self._instruments.errors.labels(*labels).inc()
            self.attempts.failed(message.message_id)

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        if self._instruments is None:
            return
        self._finish(message)
        if self.attempts.deferred(message.message_id):
            self._instruments.deferred.labels(*_labels(message)).inc()
        elif not message.failed:
            self._instruments.skipped.labels(*_labels(message)).inc()

    def after_nack(self, broker: Broker, message: MessageProxy) -> None:
        self.attempts.done()
        if self._instruments is not None and not wants_redelivery(message):  # counted once published
            self._instruments.rejects.labels(*_labels(message)).inc()

    def after_ack(self, broker: Broker, message: MessageProxy) -> None:
        self.attempts.done()


class _QueueCollector:
    """Queue depths asked from RabbitMQ at scrape time, for the queues the group's workers consume."""

    def __init__(self, group: Path, depths: QueueDepths) -> None:
        self.group = group
        self.depths = depths

    def queues(self) -> list[str]:
        names: set[str] = set()
        for path in self.group.glob("queues-*.json"):
            with contextlib.suppress(OSError, ValueError):
                names.update(json.loads(path.read_text()))
        return sorted(names)

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        up = GaugeMetricFamily("jobs_queue_stats_up", "Whether RabbitMQ answered the queue-depth query.")
        queues = self.queues()
        try:
            depths = self.depths(queues) if queues else {}
        except Exception as exc:
            logger.warning("queue_depths_failed", extra={"error": f"{type(exc).__name__}: {exc}"})
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        messages = GaugeMetricFamily(
            "jobs_queue_messages",
            "Messages of a queue: waiting (ready), unacked (running, prefetched), delayed (.DQ), dead (DLQ).",
            labels=["queue", "state"],
        )
        consumers = GaugeMetricFamily("jobs_queue_consumers", "Consumers of a queue.", labels=["queue"])
        for queue, counts in depths.items():
            for state in ("waiting", "unacked", "delayed", "dead"):
                value = counts.get(state)
                if value is not None:
                    messages.add_metric([queue, state], value)
            if counts.get("consumers") is not None:
                consumers.add_metric([queue], counts["consumers"] or 0)
        yield messages
        yield consumers


def serve(directory: Path, host: str, port: int, depths: QueueDepths | None = None) -> int:
    """Serve the group's metrics on ``host:port`` until the process is stopped (a Dramatiq fork)."""
    import prometheus_client as prom
    from prometheus_client import multiprocess

    group = group_directory(directory)
    group.mkdir(parents=True, exist_ok=True)
    registry = prom.CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(group))  # type: ignore[no-untyped-call]
    if depths is not None:
        registry.register(_QueueCollector(group, depths))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            output = prom.generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", prom.CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(output)))
            self.end_headers()
            self.wfile.write(output)

        def log_message(self, format: str, *args: Any) -> None:
            return  # one line per scrape is noise

    try:
        server = HTTPServer((host, port), Handler)
    except OSError as exc:
        logger.error("metrics_server_failed", extra={"host": host, "port": port, "error": str(exc)})
        return 1
    logger.info("metrics_server_started", extra={"host": host, "port": port})
    server.serve_forever()
    return 0
