"""Fixtures of both tiers: the test process's environment and a queue prefix per test, whose keys
in the test Redis are deleted after it; a run that leaves any behind fails."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
import redis
import requests

from jobsystem.settings import load_settings
from jobsystem.store.redis import delete_matching
from tests.queues import delete_prefixed
from tests.senders import flush_senders
from tests.support import TEST_REDIS_URL

#: The environment variable that carries this run's mark to pytest-xdist's workers (started after
#: ``pytest_configure``, with the controller's environment).
_RUN_MARK = "JOBSYSTEM_TEST_RUN"
#: Where a test's keys live in the test Redis: the system's state, the test actors' records.
_NAMESPACES = ("jobs:", "test:")


def pytest_configure(config: pytest.Config) -> None:
    """The test process's own system (built when a test module imports ``actors``) keeps its state
    in the test Redis database, not in a file of the checkout. Every prefix of this run starts with
    the same mark, so that the run can look for what it left, and only for that."""
    os.environ["STATE_URL"] = TEST_REDIS_URL
    if not hasattr(config, "workerinput"):
        os.environ[_RUN_MARK] = uuid.uuid4().hex[:4]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Once every test is over (in the process that ran or dispatched them all): delete what this
    run's tests left, failing the run for keys in the test Redis and reporting queues on the vhost."""
    if hasattr(session.config, "workerinput"):
        return
    _sweep_redis(session)
    _sweep_vhost(session)


def _sweep_redis(session: pytest.Session) -> None:
    """Fail a run that left keys of its own tests in the test Redis (a write that landed after its
    test's clean-up: from a worker still running, a background writer), then delete them."""
    client = redis.Redis.from_url(TEST_REDIS_URL)
    try:
        patterns = [f"{namespace}t{os.environ[_RUN_MARK]}*" for namespace in _NAMESPACES]
        left = [key.decode() for pattern in patterns for key in client.scan_iter(pattern, count=1000)]
        if left:
            client.unlink(*left)
    except redis.ConnectionError:
        return  # no Redis: the tests that need one failed already
    finally:
        client.close()
    if left:
        prefixes = sorted({key.split(":", 1)[1].split("-", 1)[0] for key in left})
        writer = session.config.get_terminal_writer()
        writer.line()
        writer.line(f"keys left in the test Redis by this run's tests: {len(left)}, of {prefixes}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _sweep_vhost(session: pytest.Session) -> None:
    """Delete the queues and exchanges this run's tests left on the vhost, and name them. Reported,
    not failed: one clean-clone CI run left a single ``.DLQ`` of the restart test, which no later
    run reproduced; failing on it would make CI fail at random on a race not yet understood."""
    settings = load_settings(os.environ)
    try:
        left = delete_prefixed(settings, f"t{os.environ[_RUN_MARK]}")
    except requests.RequestException:
        return  # no management API: the tests that need it failed already
    if left:
        writer = session.config.get_terminal_writer()
        writer.line()
        writer.line(
            f"queues and exchanges left on the vhost by this run's tests, deleted: {left}", yellow=True
        )


@pytest.fixture
def prefix() -> Iterator[str]:
    """A queue-name (and state-key namespace) prefix no other test uses.

    Its keys in the test Redis (the system's ``jobs:<prefix>``, the test actors' ``test:<prefix>``)
    are deleted when the test is over: after every fixture that uses the prefix, so after its
    workers are stopped, whatever order the test asked for its fixtures in, and after its senders'
    background writes."""
    name = f"t{os.environ[_RUN_MARK]}{uuid.uuid4().hex[:6]}-"
    yield name
    flush_senders()
    client = redis.Redis.from_url(TEST_REDIS_URL)
    try:
        for namespace in _NAMESPACES:
            delete_matching(client, f"{namespace}{name}*")
    except redis.ConnectionError:
        pass  # a test that needs no Redis, run without one: it wrote nothing there
    finally:
        client.close()
