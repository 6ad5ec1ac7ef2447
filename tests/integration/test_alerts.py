"""The scheduled health check alerts once per degraded condition: in the logs and to Sentry.

A local HTTP server stands in for Sentry and records the envelopes the worker sends.
"""

from __future__ import annotations

import gzip
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import quote

import pytest
import requests

from actors.health import check_health
from tests import workload
from tests.servers import free_port
from tests.support import wait_for
from tests.workers import final_events


@contextmanager
def sentry_recorder() -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """A Sentry stand-in on loopback: yields its port and the events it received."""
    events: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            lines = body.split(b"\n")
            # An envelope: a header line, then (item header, payload) pairs.
            for header, payload in zip(lines[1::2], lines[2::2], strict=False):
                if json.loads(header).get("type") == "event":
                    events.append(json.loads(payload))
            self.send_response(200)
            self.end_headers()

        def log_message(self, format, *args):
            return

    port = free_port()
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield port, events
    finally:
        server.shutdown()


@pytest.fixture
def sentry():
    with sentry_recorder() as recorder:
        yield recorder


def test_alert_fires_once_per_condition_and_again_after_it_cleared(start_worker, queues, prefix, sentry):
    port, events = sentry
    worker = start_worker(SENTRY_DSN=f"http://key@127.0.0.1:{port}/1", HEALTH_MAX_WAITING="3")
    backlog = f"{prefix}backlog"  # a queue no worker consumes
    queues.broker.declare_queue(backlog, ensure=True)

    def fill() -> None:
        for i in range(5):
            queues.broker.enqueue(queues.message(workload.record, f"b{i}").copy(queue_name=backlog))

    def run_check() -> None:
        # The job's own end, not its health_checked line: alert() logs after that line.
        message = queues.send(check_health, [backlog])
        wait_for(lambda: final_events([worker], [message.message_id])[message.message_id], what="the check")

    def alerts() -> list[str]:
        return [
            json.loads(line)["condition"] for line in worker.output().splitlines() if "queue_degraded" in line
        ]

    fill()
    for _ in range(3):
        run_check()
    conditions = {f"backlog:{backlog}", f"no_consumers:{backlog}"}
    assert sorted(alerts()) == sorted(conditions)
    wait_for(lambda: len(events) >= 2, what="the Sentry events")
    assert sorted(e["tags"]["condition"] for e in events) == sorted(conditions)
    assert {e["level"] for e in events} == {"warning"}

    requests.delete(queues.api(f"/{quote(backlog, safe='')}/contents"), auth=queues.auth, timeout=10)
    run_check()
    assert worker.output().count("queue_recovered") == 2 and len(alerts()) == 2

    fill()
    run_check()
    run_check()
    assert sorted(alerts()) == sorted([*conditions, *conditions])
    wait_for(lambda: len(events) >= 4, what="the second round of Sentry events")
    assert len(events) == 4
