"""An SQLite store shared by threads: what one thread does must not leave another's connection
open for good, a transaction open for good, or a batch undone."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from jobsystem.store.sqlite import SqliteStore
from tests.support import fresh_store


def _closed(conn: sqlite3.Connection) -> bool:
    try:
        conn.execute("SELECT 1")
    except sqlite3.ProgrammingError:
        return True
    return False


def test_the_connections_of_threads_that_ended_are_closed_when_another_thread_opens_one(tmp_path: Path):
    """A thread that ends without release_thread() (a dashboard request thread, which anyio retires
    after 10 s idle; a timer's retry) kept its connection, three file descriptors, for as long as
    the store lived: one more per thread, and a dashboard or a worker never closes its store."""
    with fresh_store("sqlite", tmp_path) as store:
        assert isinstance(store, SqliteStore)
        opened: list[sqlite3.Connection] = []

        def request() -> None:
            store.get("k")
            opened.append(store.connection())

        for _ in range(4):
            thread = threading.Thread(target=request)
            thread.start()
            thread.join()
        assert [_closed(conn) for conn in opened] == [True, True, True, False]  # the last: until the next
        assert list(store._connections) == opened[-1:]


def test_a_connection_close_retired_is_closed_once_its_thread_ended(tmp_path: Path):
    """close() leaves a connection whose thread lives (it may be mid-statement) for that thread to
    close at its next call; a thread that ended first (a poller stopped after the close) made none."""
    with fresh_store("sqlite", tmp_path) as store:
        assert isinstance(store, SqliteStore)
        opened: list[sqlite3.Connection] = []
        ready, store_closed = threading.Event(), threading.Event()

        def poller() -> None:
            opened.append(store.connection())
            ready.set()
            store_closed.wait(10)  # then stopped: no further call

        thread = threading.Thread(target=poller)
        thread.start()
        assert ready.wait(10)
        store.close()
        store_closed.set()
        thread.join(10)
        assert store.get("k") is None  # the next call of another thread (a new poller, a request)
        assert _closed(opened[0])
        assert list(store._connections) == [store.connection()]
