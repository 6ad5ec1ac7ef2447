"""Dashboard figures for ``make bench``: each page and endpoint's latency at 50 queues, 1 million
job status records and 10,000 dead letters (``python -m bench --dashboard-only`` runs just this).

Seeding is direct, not through workers: 50 queues declared with a few waiting messages each (so
the health check peeks at every head), status records written into the state store by the status
backend in batches of 5,000 (each record indexed, timed and counted as a worker's would be), and
10,000 dead letters published to one ``.DLQ`` and indexed as the worker indexes them. Then a real
``jobctl dashboard`` serves them and every endpoint is asked ``rounds`` times; medians and 95th
percentiles are printed. The POST that retries two dead letters of the 10,000 is timed once: an
action reads the queue (RabbitMQ cannot seek), a page never does. Everything seeded is deleted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pika
import requests
from dramatiq import Message

from bench import scratch

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
STATES = ["succeeded"] * 90 + ["dead"] * 5 + ["retrying"] * 3 + ["running"] * 2
ADMIN = ("admin", "bench-admin-password")


def _seed_status(store: Any, queues: list[str], count: int) -> list[str]:
    from jobsystem.store.status import status_backend
    from jobsystem.store.status_records import StatusUpdate, order_of

    backend = status_backend(store)
    now = int(time.time() * 1000)
    ids: list[str] = []
    for start in range(0, count, 5_000):
        batch = []
        for i in range(start, min(start + 5_000, count)):
            message_id = uuid.uuid4().hex
            state = STATES[i % len(STATES)]
            queue = queues[i % len(queues)]
            at = now - (count - i) * 3  # spread over the last ~50 minutes, oldest first
            once = {"actor": f"actor{i % 7}", "queue": queue, "enqueued_at": str(at)}
            fields = {"state": state, "updated_at": str(at + 20), "attempts": "1"}
            if state == "dead":
                fields.update(error_type="ConnectionError", error="partner API down")
            batch.append(StatusUpdate(message_id, queue, order_of(1, state), fields, once))
            ids.append(message_id)
        backend.apply(batch, 86_400_000)
    return ids


def _seed_dead_letters(broker: Any, queue: str, count: int) -> list[str]:
    from jobsystem.rabbitmq.broker import dead_letter_queue
    from jobsystem.rabbitmq.dead_letter_indexer import entry_from_headers

    channel = broker.connection.channel()
    channel.confirm_delivery()
    ids = []
    entries = []
    for i in range(count):
        message: Message[Any] = Message(queue_name=queue, actor_name="actor3", args=(), kwargs={}, options={})
        exception = ("ConnectionError", "TimeoutError", "KeyError")[i % 3]
        headers = {
            "x-dl-reason": "retries_exhausted",
            "x-dl-exception": exception,
            "x-dl-error": "partner API down",
            "x-dl-traceback": "Traceback (most recent call last):\n" + "  File ...\n" * 20,
            "x-dl-attempts": 6,
            "x-dl-queue": queue,
            "x-dl-actor": "actor3",
            "x-dl-enqueued-at": "2026-11-29T00:00:00+00:00",
            "x-dl-failed-at": f"2026-11-29T00:{i // 600 % 60:02d}:{i // 10 % 60:02d}+00:00",
            "x-dl-environment": broker.environment,  # as its workers stamp them
        }
        properties = pika.BasicProperties(delivery_mode=2, message_id=message.message_id, headers=headers)
        channel.basic_publish("", dead_letter_queue(queue), message.encode(), properties)
        entries.append(entry_from_headers(queue, message.message_id, headers))
        ids.append(message.message_id)
    channel.close()
    index = broker.dead_letter_index
    for start in range(0, len(entries), 1_000):
        index.backend.add(entries[start : start + 1_000], ttl_ms=None, max_length=None)
    return ids


def _time(path: str, url: str, rounds: int) -> tuple[float, float]:
    took = []
    for _ in range(rounds):
        started = time.perf_counter()
        response = requests.get(url + path, auth=ADMIN, timeout=60)
        took.append((time.perf_counter() - started) * 1000)
        response.raise_for_status()
    took.sort()
    return statistics.median(took), took[min(len(took) - 1, int(len(took) * 0.95))]


def _paths(queues: list[str], ids: list[str], deep: str) -> list[str]:
    """What is timed: every page and API endpoint, filters and searches included."""
    return [
        "/",
        "/api/queues",
        "/jobs",
        "/api/jobs",
        "/api/jobs?state=dead",
        f"/api/jobs?queue={queues[3]}&state=succeeded",
        "/api/jobs?actor=actor2&state=retrying",
        f"/api/jobs?queue={queues[3]}&actor=actor3",
        f"/api/jobs?before={deep}",
        f"/api/jobs?q={ids[500_000 % len(ids)]}",
        f"/jobs/{ids[-1]}",
        f"/api/jobs/{ids[-1]}",
        "/dead-letters",
        "/api/dead-letters",
        f"/api/dead-letters?queue={queues[7]}&exception=KeyError",
        "/schedules",
        "/api/schedules",
        "/rate-limits",
        "/api/rate-limits",
        "/workers",
        "/api/workers",
        "/audit",
        "/api/audit",
    ]


def _serve(env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    """A real ``jobctl dashboard`` on a port of its own, once its overview has queues to show."""
    port = 18_000 + os.getpid() % 1000
    dashboard = subprocess.Popen(
        [str(BIN / "jobctl"), "dashboard", "--port", str(port)],
        cwd=ROOT,
        env={**env, "DASHBOARD_ADMIN_PASSWORD": ADMIN[1]},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if requests.get(url + "/api/queues", auth=ADMIN, timeout=5).json().get("queues"):
                break
        except (requests.RequestException, ValueError):
            pass
        time.sleep(0.5)
    return dashboard, url


def _deep_cursor(url: str, pages: int = 21) -> str:
    """The cursor ``pages`` pages of 200 jobs in (4,000 jobs deep by default)."""
    cursor = ""
    for _ in range(pages):
        reply = requests.get(url + f"/api/jobs?limit=200&before={cursor}", auth=ADMIN, timeout=60)
        cursor = reply.json()["next"]
    return cursor


def _timed_retry(url: str, queue: str, dead_ids: list[str]) -> str:
    """The POST that retries the two newest of the 10,000 dead letters, timed once."""
    token = requests.get(url + "/api/csrf", auth=ADMIN, timeout=10).json()["token"]
    started = time.perf_counter()
    reply = requests.post(
        url + "/api/dead-letters/retry",
        auth=ADMIN,
        json={"queue": queue, "ids": dead_ids[-2:]},
        headers={"Origin": url, "X-CSRF-Token": token},
        timeout=300,
    ).json()
    return (
        f"  POST /api/dead-letters/retry, 2 of 10,000 (reads the queue) "
        f"{time.perf_counter() - started:>6.2f} s  {reply}"
    )


def _clean_up(system: Any) -> None:
    """Delete the queues and exchanges, and the state seeded (every key of the bench's namespace)."""
    scratch.delete_topology(system.broker, system.settings)
    if system.store.kind == "redis":
        scratch.delete_state(system.settings.state_url, system.settings.queue_prefix)


def dashboard_figures(state_url: str, records: int = 1_000_000, rounds: int = 20) -> list[str]:
    """Lines of figures: one per endpoint (median and p95 ms), then the seeding and an action."""
    from jobsystem.settings import load_settings
    from jobsystem.system import build_system

    prefix = scratch.new_prefix()
    env = {**os.environ, "QUEUE_PREFIX": prefix, "STATE_URL": state_url, "LOG_LEVEL": "WARNING"}
    system = build_system(load_settings(env))
    broker = system.broker
    queues = [f"{prefix}q{i:02d}" for i in range(50)]
    lines: list[str] = []
    dashboard = None
    try:
        started = time.perf_counter()
        for queue in queues:
            broker.declare_queue(queue, ensure=True)
            for _ in range(3):
                broker.channel.basic_publish("", queue, Message(queue, "actor0", (), {}, {}).encode())
        ids = _seed_status(system.store, queues, records)
        dead_ids = _seed_dead_letters(broker, queues[7], 10_000)
        lines.append(
            f"  seeded 50 queues, {records:,} status records, 10,000 dead letters in "
            f"{time.perf_counter() - started:.0f} s"
        )
        dashboard, url = _serve(env)
        for path in _paths(queues, ids, _deep_cursor(url)):
            median, p95 = _time(path, url, rounds)
            label = path if len(path) < 60 else path[:57] + "..."
            lines.append(f"  GET {label:<60} {median:>7.1f} ms  p95 {p95:>7.1f} ms")
        lines.append(_timed_retry(url, queues[7], dead_ids))
    finally:
        if dashboard is not None:
            dashboard.terminate()
            dashboard.wait(30)
        _clean_up(system)
        broker.close()
    return lines


def add_dashboard_arguments(parser: argparse.ArgumentParser) -> None:
    """``--dashboard-only`` and ``--dashboard-records`` of ``python -m bench``."""
    parser.add_argument(
        "--dashboard-only",
        action="store_true",
        help="only the dashboard's latencies (1M records, 10k dead letters)",
    )
    parser.add_argument("--dashboard-records", type=int, default=1_000_000, help="status records seeded")


def dashboard_report(state_url: str, records: int) -> None:
    """Print the dashboard's figures on the store at ``state_url``."""
    print(f"dashboard: 50 queues, {records:,} status records, 10,000 dead letters")
    for line in dashboard_figures(state_url, records):
        print(line)
