"""The worker group's Prometheus endpoint: a Dramatiq fork process serving ``/metrics``.

:class:`~middleware.metrics.Metrics` names :func:`serve_metrics` as its fork. The fork starts
from the ``dramatiq`` main process, which never built the system, so the function reads the
settings itself. It serves the counters of every worker process of the group (their sample files)
and queue depths asked from RabbitMQ at scrape time, for the queues the workers consume. While its
port is in use it keeps trying to bind it (:func:`bind_endpoint`); the workers run meanwhile.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

from jobsystem.observability.logs import configure_logging
from jobsystem.ops.health import queue_depths
from jobsystem.privacy.outage_lines import log_outage
from jobsystem.settings import load_settings
from jobsystem.store import open_store
from middleware.metrics import group_directory

__all__ = ["QueueDepths", "bind_endpoint", "serve", "serve_metrics"]

logger = logging.getLogger(__name__)

#: Queue name -> {"waiting": n, "unacked": n, "delayed": n, "scheduled": n, "dead": n,
#: "consumers": n}; None = unknown.
QueueDepths = Callable[[list[str]], dict[str, dict[str, int | None]]]


def serve_metrics() -> int:
    """Serve ``/metrics`` on ``PROMETHEUS_HOST:PROMETHEUS_PORT``: the group's counters, queue depths.
    Its lines are the project's events, as the worker processes' are (fields kept, scrubbed)."""
    settings = load_settings()
    configure_logging(settings)
    state = open_store(settings.state_url, namespace=settings.state_namespace, timeout=settings.state_timeout)
    return serve(
        settings.prometheus_dir,
        settings.prometheus_host,
        settings.prometheus_port,
        lambda queues: queue_depths(settings, queues, state=state),
    )


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
            log_outage(logger, logging.WARNING, "queue_depths_failed", exc)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        messages = GaugeMetricFamily(
            "jobs_queue_messages",
            "Messages of a queue: waiting (ready), unacked (running, prefetched), delayed (.DQ), "
            "scheduled (in RabbitMQ's delay cascade), dead (DLQ).",
            labels=["queue", "state"],
        )
        consumers = GaugeMetricFamily("jobs_queue_consumers", "Consumers of a queue.", labels=["queue"])
        for queue, counts in depths.items():
            for state in ("waiting", "unacked", "delayed", "scheduled", "dead"):
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
        server = bind_endpoint(host, port, Handler)
    except OSError as exc:
        logger.error("metrics_server_failed", extra={"host": host, "port": port, "error": str(exc)})
        return 1
    logger.info("metrics_server_started", extra={"host": host, "port": port})
    server.serve_forever()
    return 0


def bind_endpoint(
    host: str,
    port: int,
    handler: type[BaseHTTPRequestHandler],
    *,
    first_retry_s: float = 1.0,
    max_retry_s: float = 30.0,
    sleep: Callable[[float], None] = time.sleep,
) -> HTTPServer:
    """The endpoint's server, bound once ``host:port`` is free.

    A port in use is usually held for a while only: the last worker group's endpoint still
    stopping, or a client connection of this host that the kernel gave the port as its own
    end. The fork keeps trying (every ``first_retry_s``, doubling up to ``max_retry_s``),
    logging each failure, rather than leave the group without metrics until its restart. Any
    other error (an address not of this host, a port the process may not open) is raised.
    """
    delay, attempt = first_retry_s, 0
    while True:
        try:
            return HTTPServer((host, port), handler)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            attempt += 1
            fields = {"host": host, "port": port, "error": str(exc), "attempt": attempt, "retry_in_s": delay}
            logger.error("metrics_server_failed", extra=fields)
        sleep(delay)
        delay = min(delay * 2, max_retry_s)
