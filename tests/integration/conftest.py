"""Fixtures of the integration tier: the test's queues on the real RabbitMQ, worker subprocesses,
and the clean-up of the queues (the test's keys in the test Redis: the ``prefix`` fixture)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from jobsystem.rabbitmq.delays import DelayCascade
from jobsystem.system import get_system
from tests.dashboard_server import DASHBOARD_ADMIN, DASHBOARD_VIEWER, Dashboard
from tests.queues import Queues, drop_closed
from tests.senders import sender_broker
from tests.support import TEST_REDIS_URL, worker_env
from tests.workers import Worker


@pytest.fixture(autouse=True)
def _cascades_prefixed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests share a vhost with whatever else runs on it: a test that sends through the
    unprefixed default broker (``send_bulk`` without ``broker=``) would declare the unprefixed
    delay cascade, a production name, and leave it there. Refused here, so such a test fails."""
    declare = DelayCascade.declare

    def declare_prefixed(cascade: DelayCascade, channel: object) -> None:
        if not cascade.prefix:
            raise AssertionError("a test declared the unprefixed delay cascade: pass the test's broker")
        declare(cascade, channel)

    monkeypatch.setattr(DelayCascade, "declare", declare_prefixed)


@pytest.fixture
def queues(prefix: str) -> Iterator[Queues]:
    """The test's queues, sent to through a broker whose state (idempotency keys) is the test's own."""
    drop_closed(get_system().broker)
    q = Queues(prefix, sender_broker(prefix, TEST_REDIS_URL))
    yield q
    q.delete_all()
    drop_closed(get_system().broker)


@pytest.fixture
def store() -> Iterator[redis.Redis]:
    """The Redis the test actors write to (the ``prefix`` fixture deletes the test's keys)."""
    client = redis.Redis.from_url(TEST_REDIS_URL, decode_responses=True)
    yield client
    client.close()


@pytest.fixture(params=["redis", "sqlite"])
def state_url(request: pytest.FixtureRequest, prefix: str, tmp_path: Path) -> Iterator[str]:
    """Each state store backend in turn; the test's Redis keys are deleted afterwards."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/state.db"
        return
    yield TEST_REDIS_URL  # the ``prefix`` fixture deletes the test's keys


@pytest.fixture
def start_worker(prefix: str, tmp_path: Path, queues: Queues) -> Iterator[Callable[..., Worker]]:
    """Start ``dramatiq actors tests.workload`` subprocesses on the test's queues, each returned once
    its consumers are on every queue it consumes; all are stopped after."""
    started: list[Worker] = []

    def start(processes: int = 1, threads: int = 4, **env: str) -> Worker:
        # A worker killed a moment ago may still count among its queues' consumers (RabbitMQ drops
        # them once it has seen the connections close): counted for the new worker's below, the
        # wait would end before it subscribed. Wait until only the running workers' count.
        queues.wait_consumed(running_processes, at_most=True)
        log = tmp_path / f"worker-{len(started)}.log"
        worker = Worker(log, worker_env(prefix, tmp_path, **env), processes=processes, threads=threads)
        started.append(worker)
        worker.wait_ready()
        # Ready is logged once the consumer threads started, before they declared and subscribed to
        # their queues: wait for a consumer of each running worker process on every one of them.
        queues.wait_consumed(lambda: running_processes(worker))
        return worker

    def running_processes(worker: Worker | None = None) -> int:
        if worker is not None:
            worker.check_running()
        return sum(w.processes for w in started if w.proc.poll() is None)

    yield start
    for worker in started:
        if worker.proc.poll() is None:
            worker.kill()
            worker.proc.wait(10)


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


@pytest.fixture
def sender(queues: Queues, prefix: str, state_url: str) -> Queues:
    """The test's queues sent to through a broker on each state store backend in turn (the
    worker must be given ``STATE_URL=state_url``)."""
    return queues.using(sender_broker(prefix, state_url))


@pytest.fixture
def key(prefix: str) -> Callable[[str], str]:
    """The name of a key the test actors write (``tests.workload.key`` in the worker)."""
    return lambda name: f"test:{prefix}{name}"
