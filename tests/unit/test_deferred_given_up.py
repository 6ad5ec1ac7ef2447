"""Writes a stopping worker gives up on are said so: one ERROR line naming their kinds and counts.

``DeferredWrites.stop()`` waits a bounded time for the queued writes; with the store down it gave
up on them and said nothing, although a completion or a release given up leaves its key leased
until the lease lapses, and a copy of the message then runs the job again (review 6). The line
names no key and nothing of a job's contents.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobsystem.runtime.deferred import Buffered, DeferredWrites
from jobsystem.store.base import StateStore
from jobsystem.store.sqlite import sqlite_error
from tests.support import fresh_store

#: How long ``stop()`` waits here for the writes it then gives up on.
STOP_WAIT_S = 0.3


#: Set while the store is down: the test's writes fail in a way that passes, and are retried.
store_down = threading.Event()


def _complete_many(view: StateStore, items: list[Any]) -> None:
    """A completion write, failing while the store is down (a busy SQLite file: a failure that
    passes, retried until the store answers)."""
    if store_down.is_set():
        raise sqlite_error(sqlite3.OperationalError("database is locked"))


def _release_many(view: StateStore, items: list[Any]) -> None:
    _complete_many(view, items)


@pytest.fixture
def writes(tmp_path: Path) -> Iterator[DeferredWrites]:
    """A writer on a store that is down; it comes back when the test is over (the writer drains)."""
    with fresh_store("sqlite", tmp_path) as store:
        store_down.set()
        writes = DeferredWrites(store, linger=0.0, retry_delay=0.01)
        try:
            yield writes
        finally:
            store_down.clear()
            assert writes.flush(10.0)


def given_up(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == "deferred_writes_given_up"]


def test_stopping_with_the_store_down_logs_the_writes_given_up_once(
    writes: DeferredWrites, caplog: pytest.LogCaptureFixture
) -> None:
    statuses = Buffered(take=lambda ids: ids, apply=_release_many)
    writes.submit(_complete_many, ("order-7:ada@example.com", "{}", 60_000))
    writes.submit(_complete_many, ("order-8", "{}", 60_000))
    writes.submit(_release_many, ("order-9", "owner-1"))
    writes.submit(statuses, "message-1")
    writes.stop(timeout=STOP_WAIT_S)
    writes.stop(timeout=STOP_WAIT_S)  # the worker's middleware share one writer: each stops it
    lines = given_up(caplog)
    assert [(r.levelno, r.kinds, r.writes) for r in lines] == [  # type: ignore[attr-defined]
        (logging.ERROR, {"_complete_many": 2, "_release_many": 2}, 4)
    ]
    assert "order-" not in str(vars(lines[0])) and "ada@" not in str(vars(lines[0]))


def test_stopping_once_everything_is_written_logs_nothing(
    writes: DeferredWrites, caplog: pytest.LogCaptureFixture
) -> None:
    written: list[Any] = []
    writes.submit(lambda view, items: written.extend(items), "done")
    writes.stop(timeout=10.0)
    assert (written, given_up(caplog)) == (["done"], [])
