"""Fixtures of the unit tier: in-process, on the real Redis and SQLite store backends; no RabbitMQ,
no worker subprocess."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from jobsystem.store import StateStore
from tests.support import fresh_store


@pytest.fixture(params=["redis", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StateStore]:
    """Each state store backend in turn, in a namespace of the test's own (deleted after)."""
    with fresh_store(request.param, tmp_path) as state:
        yield state
