"""Helpers shared by the tests: the checkout's paths, the test Redis, a worker's environment and a
run of one to its end, a fresh state store, and waiting for a condition or a call."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from jobsystem.store import StateStore, open_store
from jobsystem.store.redis import RedisStore, delete_matching

__all__ = [
    "BIN",
    "ROOT",
    "TEST_RATE_LIMITS",
    "TEST_REDIS_URL",
    "finished_within",
    "fresh_store",
    "run_bench",
    "run_worker",
    "wait_for",
    "within",
    "worker_env",
]

ROOT = Path(__file__).resolve().parent.parent


BIN = Path(sys.executable).parent


#: The Redis database the tests keep their state in (each test in a namespace of its own).
TEST_REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


#: Workers' RATE_LIMITS unless a test sets its own: the email tests send dozens of mails at once.
TEST_RATE_LIMITS = json.dumps({"smtp": {"rate": 1000, "burst": 1000}})


def worker_env(prefix: str, tmp_path: Path, **overrides: str) -> dict[str, str]:
    """The environment of a worker on the test's queues (``prefix``), logging JSON lines."""
    env = dict(os.environ)
    env.update(
        QUEUE_PREFIX=prefix,
        LOG_FORMAT="json",
        REPORTS_DIR=str(tmp_path / "reports"),
        MEDIA_DIR=str(tmp_path / "media"),
        JOB_MIN_BACKOFF_MS="200",
        JOB_MAX_BACKOFF_MS="2000",
        TEST_REDIS_URL=TEST_REDIS_URL,
        STATE_URL=TEST_REDIS_URL,  # each test in a namespace of its own: the QUEUE_PREFIX of its queues
        # No metrics server unless a test asks for one on a free port (9191 may be taken).
        PROMETHEUS_PORT="0",
        RATE_LIMITS=TEST_RATE_LIMITS,
    )
    env.update(overrides)
    return env


def run_worker(
    prefix: str, tmp_path: Path, *, processes: int = 1, **env: str
) -> subprocess.CompletedProcess[str]:
    """``dramatiq actors tests.workload`` run to its end (a worker that must not start), its output
    captured."""
    return subprocess.run(
        [str(BIN / "dramatiq"), "actors", "tests.workload", "-p", str(processes), "-t", "1"],
        cwd=ROOT,
        env=worker_env(prefix, tmp_path, **env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def run_bench(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python -m bench ARGS`` from the repository's root, its output captured as text."""
    root = Path(__file__).resolve().parent.parent
    command = [sys.executable, "-m", "bench", *args]
    return subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=timeout, check=False)


@contextlib.contextmanager
def fresh_store(kind: str, tmp_path: Path) -> Iterator[StateStore]:
    """A state store of ``kind`` (redis: the test Redis, in a namespace of its own, deleted after;
    sqlite: a file under ``tmp_path``). Cleaned up also when the body raises: a test that fails
    inside ``with fresh_store(...)`` would otherwise leave its keys in the test Redis."""
    if kind == "sqlite":
        sqlite = open_store(f"sqlite:///{tmp_path}/state.db")
        try:
            yield sqlite
        finally:
            sqlite.close()
        return
    namespace = f"test-{uuid.uuid4().hex[:8]}:"
    redis = open_store(TEST_REDIS_URL, namespace=namespace)
    assert isinstance(redis, RedisStore)
    try:
        yield redis
    finally:
        delete_matching(redis.client, f"{namespace}*")
        redis.close()


def wait_for(
    predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.05, what: str = ""
) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what or predicate}")
        time.sleep(interval)


def within(seconds: float, call: Callable[[], Any]) -> Any:
    """``call()``'s result, or the exception it raised, run in a thread of its own: the test fails
    if it takes longer than ``seconds`` (a call that would hang fails instead of hanging the run;
    the thread is a daemon, which the test's clean-up must let end)."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # handed to the test, interrupts included
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"still running after {seconds:g} s"
    return outcome[0]


T = TypeVar("T")


def finished_within(seconds: float, function: Callable[[], T]) -> T:
    """``function()``'s value, its exception raised, failing the test when it takes longer than
    ``seconds`` (see :func:`within`)."""
    outcome = within(seconds, function)
    if isinstance(outcome, BaseException):
        raise outcome
    value: T = outcome
    return value
