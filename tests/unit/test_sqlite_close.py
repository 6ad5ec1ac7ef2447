"""Closing a SQLite store (or registering a feature's tables) while other threads use it: no
crash, no batch split, nothing held open by threads that ended (CPython 3.11 crashes when a
connection is closed under another thread's running statement; a worker's pollers may be
mid-statement as their process closes the store)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from jobsystem.store.sqlite import SqliteStore

_CLOSE_UNDER_READERS = textwrap.dedent(
    """
    import sys, threading
    from jobsystem.store.sqlite import SqliteStore

    store = SqliteStore(sys.argv[1])
    store.set("k", b"v" * 1000)
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            try:
                store.rows("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000) "
                           "SELECT count(*) FROM n, kv")
            except Exception:
                pass

    readers = [threading.Thread(target=read) for _ in range(4)]
    for reader in readers:
        reader.start()
    for _ in range(300):
        store.close()
    stop.set()
    for reader in readers:
        reader.join()
    print("closed under readers")
    """
)


def test_closing_the_store_under_running_statements_does_not_crash_the_process(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CLOSE_UNDER_READERS, str(tmp_path / "state.db")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parents[2],
    )
    assert (done.returncode, done.stdout.strip()) == (0, "closed under readers"), done.stderr[-2000:]


def _register_a_schema(store: SqliteStore) -> None:
    """A feature used for the first time (the health check's status tables with JOB_STATUS off, a
    dashboard page): its tables were applied by the batch's next statement, with a BEGIN inside the
    open transaction, which failed, and a ROLLBACK that undid the batch; a caller going on wrote
    the rest outside any transaction."""
    store.ensure_schema("CREATE TABLE IF NOT EXISTS late (a INTEGER);")


@pytest.mark.parametrize("meanwhile", [SqliteStore.close, _register_a_schema], ids=["close", "new_schema"])
def test_a_batch_another_thread_acts_under_commits_whole(
    tmp_path: Path, meanwhile: Callable[[SqliteStore], None]
) -> None:
    store = SqliteStore(tmp_path / "state.db")
    inside, done = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def write_batch() -> None:
        try:
            with store.batch() as batch:
                batch.set("first", b"1")
                inside.set()
                done.wait(10)
                batch.set("second", b"2")
        except BaseException as exc:  # reported by the assertion below
            failures.append(exc)

    writer = threading.Thread(target=write_batch)
    writer.start()
    assert inside.wait(10)
    meanwhile(store)
    done.set()
    writer.join(10)
    assert failures == []
    assert (store.get("first"), store.get("second")) == (b"1", b"2")
    if meanwhile is _register_a_schema:
        assert store.rows("SELECT count(*) FROM late") == [(0,)]  # applied by the next call
    store.close()


def test_close_closes_this_threads_connection_and_those_of_ended_threads(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "state.db")
    opened: list[object] = []

    def use_once() -> None:
        opened.append(store.connection())

    ended = threading.Thread(target=use_once)
    ended.start()
    ended.join()
    mine = store.connection()
    store.close()
    for conn in (mine, *opened):
        with pytest.raises(Exception, match="closed database"):
            conn.execute("SELECT 1")  # type: ignore[attr-defined]
    assert store.get("absent") is None  # the store opens anew on its next call
    store.close()
