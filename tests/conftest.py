"""Fixtures: per-test queue prefix and Redis keys, worker subprocesses, cleanup of both."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

TEST_REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
# Before anything imports ``actors``: every test process and worker keeps its state in the test
# Redis database, each test in a namespace of its own (the QUEUE_PREFIX of its queues).
os.environ["STATE_URL"] = TEST_REDIS_URL

from tests.support import Dashboard, Queues, Worker, sender_broker  # noqa: E402

#: Workers' RATE_LIMITS unless a test sets its own: the email tests send dozens of mails at once.
TEST_RATE_LIMITS = json.dumps({"smtp": {"rate": 1000, "burst": 1000}})


@pytest.fixture
def prefix() -> str:
    """A queue-name prefix no other test uses."""
    return f"t{uuid.uuid4().hex[:10]}-"


@pytest.fixture
def queues(prefix: str) -> Iterator[Queues]:
    """The test's queues, sent to through a broker whose state (idempotency keys) is the test's own."""
    q = Queues(prefix, sender_broker(prefix, TEST_REDIS_URL))
    yield q
    q.delete_all()
    client = redis.Redis.from_url(TEST_REDIS_URL)
    keys = list(client.scan_iter(f"jobs:{prefix}*", count=1000))
    if keys:
        client.delete(*keys)


@pytest.fixture
def store(prefix: str) -> Iterator[redis.Redis]:
    """The Redis the test actors write to; the test's keys are deleted afterwards."""
    client = redis.Redis.from_url(TEST_REDIS_URL, decode_responses=True)
    yield client
    keys = list(client.scan_iter(f"test:{prefix}*", count=1000))
    if keys:
        client.delete(*keys)


def worker_env(prefix: str, tmp_path: Path, **overrides: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        QUEUE_PREFIX=prefix,
        LOG_FORMAT="json",
        REPORTS_DIR=str(tmp_path / "reports"),
        JOB_MIN_BACKOFF_MS="200",
        JOB_MAX_BACKOFF_MS="2000",
        TEST_REDIS_URL=TEST_REDIS_URL,
        # No metrics server unless a test asks for one on a free port (9191 may be taken).
        PROMETHEUS_PORT="0",
        RATE_LIMITS=TEST_RATE_LIMITS,
    )
    env.update(overrides)
    return env


@pytest.fixture(params=["redis", "sqlite"])
def state_url(request: pytest.FixtureRequest, prefix: str, tmp_path: Path) -> Iterator[str]:
    """Each state store backend in turn; the test's Redis keys are deleted afterwards."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/state.db"
        return
    yield TEST_REDIS_URL  # the ``queues`` fixture deletes the test's keys


@pytest.fixture
def start_worker(prefix: str, tmp_path: Path, queues: Queues) -> Iterator[Callable[..., Worker]]:
    """Start ``dramatiq actors tests.workload`` subprocesses on the test's queues; all are stopped after."""
    started: list[Worker] = []

    def start(processes: int = 1, threads: int = 4, **env: str) -> Worker:
        log = tmp_path / f"worker-{len(started)}.log"
        worker = Worker(log, worker_env(prefix, tmp_path, **env), processes=processes, threads=threads)
        started.append(worker)
        worker.wait_ready()
        return worker

    yield start
    for worker in started:
        if worker.proc.poll() is None:
            worker.kill()
            worker.proc.wait(10)


#: The dashboard's passwords in the tests (never printed by it: tests/test_dashboard_http.py).
DASHBOARD_ADMIN = "admin-Pa55word-for-tests"
DASHBOARD_VIEWER = "viewer-Pa55word-for-tests"


@pytest.fixture
def start_dashboard(prefix: str, tmp_path: Path, queues: Queues) -> Iterator[Callable[..., Dashboard]]:
    """Start ``jobctl dashboard tests.workload`` on a free port for the test's queues."""
    started: list[Dashboard] = []

    def start(**env: str) -> Dashboard:
        log = tmp_path / f"dashboard-{len(started)}.log"
        environment = worker_env(prefix, tmp_path, **env)
        environment.setdefault("DASHBOARD_ADMIN_PASSWORD", DASHBOARD_ADMIN)
        environment.setdefault("DASHBOARD_VIEWER_PASSWORD", DASHBOARD_VIEWER)
        dashboard = Dashboard(log, environment)
        started.append(dashboard)
        dashboard.wait_ready()
        return dashboard

    yield start
    for dashboard in started:
        dashboard.stop()
