"""Fixtures of both tiers: the test process's environment and a queue prefix per test."""

from __future__ import annotations

import os
import uuid

import pytest

from tests.support import TEST_REDIS_URL


def pytest_configure(config: pytest.Config) -> None:
    """The test process's own system (built when a test module imports ``actors``) keeps its state
    in the test Redis database, not in a file of the checkout."""
    os.environ["STATE_URL"] = TEST_REDIS_URL


@pytest.fixture
def prefix() -> str:
    """A queue-name (and state-key namespace) prefix no other test uses."""
    return f"t{uuid.uuid4().hex[:10]}-"
