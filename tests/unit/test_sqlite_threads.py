"""An SQLite store shared by threads: what one thread does must not leave another's connection
open for good, a transaction open for good, or a batch undone."""

from __future__ import annotations

import sqlite3
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from jobsystem.dramatiq_internals import raise_in_thread
from jobsystem.runtime.cancellation import JobCancelled
from jobsystem.store.base import StoreUnavailable
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


def _write(store: SqliteStore, key: str, problems: list[str]) -> None:
    """Write ``key``; what the store answers instead is noted in ``problems``."""
    try:
        store.set(key, b"1")
    except StoreUnavailable as exc:
        problems.append(f"write of {key!r}: {exc}")


def _interrupted_in_begin(store: SqliteStore, path: Path, first: Callable[[], object]) -> list[str]:
    """Run ``first()`` in a thread whose ``BEGIN IMMEDIATE`` waits for the write lock, held here,
    and cancel the thread's job meanwhile, as the cancellation poller does: CPython raises the
    exception as the call of the statement returns, once the transaction has begun. Then check,
    while the thread waits, that another connection can write; then the thread writes again.
    Returns what went wrong, in order."""
    problems: list[str] = []
    ready, go, interrupted, checked = (threading.Event() for _ in range(4))
    waiting = threading.Event()

    def note_begin(sql: str) -> None:
        if sql == "BEGIN IMMEDIATE":
            waiting.set()

    def job() -> None:
        store.connection().set_trace_callback(note_begin)
        ready.set()
        go.wait(10)
        try:
            first()
            problems.append("not interrupted")
        except JobCancelled:
            pass
        interrupted.set()
        checked.wait(10)
        try:
            _write(store, "after", problems)
        finally:
            store.release_thread()

    blocker = sqlite3.connect(path, isolation_level=None)
    thread = threading.Thread(target=job)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1.0)  # the thread leaves the trace callback before this one runs again
    try:
        thread.start()
        assert ready.wait(10)
        blocker.execute("BEGIN IMMEDIATE")
        go.set()
        assert waiting.wait(10)
        assert thread.ident is not None
        raise_in_thread(thread.ident, JobCancelled)
        blocker.execute("COMMIT")
        assert interrupted.wait(10)
        other = SqliteStore(path, busy_timeout_ms=200)  # another process's connection
        try:
            _write(other, "other", problems)
        finally:
            other.close()
    finally:
        sys.setswitchinterval(switch)
        checked.set()
        thread.join(10)
        blocker.close()
    return problems


def test_a_job_cancelled_just_after_begin_leaves_no_transaction_open(tmp_path: Path):
    """The transaction was begun outside its ``try``: the cancellation left it open on the thread's
    connection, holding SQLite's write lock from every other connection (each write of every
    process failed "database is locked") and joining the thread's later writes, never committed."""
    with fresh_store("sqlite", tmp_path) as store:
        assert isinstance(store, SqliteStore)
        assert _interrupted_in_begin(store, tmp_path / "state.db", lambda: store.set("k", b"v")) == []
        assert (store.get("k"), store.get("after")) == (None, b"1")


def test_a_job_cancelled_just_after_the_begin_of_new_tables_leaves_no_transaction_open(tmp_path: Path):
    """The same, in the transaction that creates a feature's tables at the thread's next call."""
    with fresh_store("sqlite", tmp_path) as store:
        assert isinstance(store, SqliteStore)

        def first_use() -> object:
            store.ensure_schema("CREATE TABLE IF NOT EXISTS late (a INTEGER);")
            return store.get("k")

        assert _interrupted_in_begin(store, tmp_path / "state.db", first_use) == []
        assert (store.rows("SELECT count(*) FROM late"), store.get("after")) == ([(0,)], b"1")
