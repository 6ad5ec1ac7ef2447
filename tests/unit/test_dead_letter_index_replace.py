"""A re-index makes the given entries a queue's whole dead-letter index at once, on both store
backends: a store that fails part-way leaves the old index whole (it cleared the queue's entries,
then refilled them chunk by chunk, and a failure in between left the queue's index short), and
Redis keeps nothing of the attempt. The index keeps each letter's replays, and a SQLite file of
the release before them gains the column."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from jobsystem.store import StateStore, open_store
from jobsystem.store.base import StoreUnavailable
from jobsystem.store.dead_letter_index import (
    DeadLetterEntry,
    DeadLetterFilter,
    IndexBackend,
    dead_letter_index,
)

NOW = int(time.time() * 1000)


def entry(queue: str, number: int, actor: str = "a1", replays: int | None = 0) -> DeadLetterEntry:
    return DeadLetterEntry(
        queue,
        f"m{number}",
        actor,
        "retries_exhausted",
        "E",
        "err",
        "tb",
        3,
        NOW,
        NOW + number,
        replays=replays,
    )


#: The index before the re-index: three letters of q1 (m0 twice), one of q2.
OLD = [entry("q1", 0), entry("q1", 0), entry("q1", 1, replays=1), entry("q1", 2, "a2"), entry("q2", 9)]
#: What the re-index found in q1: m1 (one replay more), m3 twice, m4 and m5 (its body not a message).
NEW = [
    entry("q1", 1, replays=2),
    entry("q1", 3),
    entry("q1", 3),
    entry("q1", 4, "a3"),
    entry("q1", 5, replays=None),
]


def contents(index: IndexBackend) -> tuple[Any, ...]:
    """Everything the index tells: its entries (newest first), counts and filter menus."""
    return index.page(DeadLetterFilter(), None, 100).entries, index.counts(), index.facets()


def staged_keys(store: StateStore) -> list[Any]:
    """The keys a Redis re-index keeps its entries under (none on SQLite)."""
    client = getattr(store, "client", None)
    return list(client.scan_iter(store.key("dl:reindex:*"))) if client is not None else []


def fail_at(store: StateStore, index: Any, which: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The store fails at the ``which`` (first, middle, last) round trip of a re-index of
    :data:`NEW` one entry at a time, as one whose connection is lost (or whose disk is full):
    Redis, its script (the last: the one that files the staged entries); SQLite, its insert.
    The keys Redis was asked to keep entries under, as they come."""
    calls, redis, staged = [0], store.kind == "redis", list[str]()
    call = {"first": 1, "middle": 3, "last": len(NEW) + redis}[which]
    if redis:
        script = index._script

        def failing(keys: list[str], args: list[Any]) -> Any:
            calls[0] += 1
            staged.extend(args[5:6] if args[4] == "stage" else [])
            if calls[0] == call:
                raise StoreUnavailable("redis: ConnectionError: Connection reset by peer")
            return script(keys=keys, args=args)

        monkeypatch.setattr(index, "_script", failing)
        return staged
    conn = store.connection()  # type: ignore[attr-defined]

    class Failing:
        def execute(self, sql: str, *parameters: Any) -> Any:
            if sql.startswith("INSERT INTO dead_letter_index"):
                calls[0] += 1
                if calls[0] == call:
                    raise sqlite3.OperationalError("database or disk is full")
            return conn.execute(sql, *parameters)

        def __getattr__(self, name: str) -> Any:
            return getattr(conn, name)

    failing_conn = Failing()
    monkeypatch.setattr(store, "connection", lambda: failing_conn)
    return staged


@pytest.mark.parametrize("which", ["first", "middle", "last"])
def test_a_reindex_whose_store_fails_part_way_leaves_the_old_index_whole(
    store: StateStore, which: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = dead_letter_index(store)
    index.add(OLD, ttl_ms=None, max_length=None)
    before = contents(index)
    staged = fail_at(store, index, which, monkeypatch)
    with pytest.raises(StoreUnavailable):
        index.replace("q1", NEW, chunk=1)
    monkeypatch.undo()
    assert contents(index) == before
    assert all(key.startswith(f"{store.namespace}dl:reindex:") for key in staged)
    assert staged_keys(store) == []  # deleted, not left to expire


def test_a_reindex_makes_the_entries_found_the_queues_whole_index(store: StateStore) -> None:
    index = dead_letter_index(store)
    index.add(OLD, ttl_ms=None, max_length=None)
    index.replace("q1", NEW, chunk=2)
    entries, counts, facets = contents(index)
    assert [(e.queue, e.message_id, e.copies, e.replays) for e in entries] == [
        ("q2", "m9", 1, 0),
        ("q1", "m5", 1, None),
        ("q1", "m4", 1, 0),
        ("q1", "m3", 2, 0),
        ("q1", "m1", 1, 2),
    ]
    assert counts == {"q1": 5, "q2": 1} and facets == {"actor": ["a1", "a3"], "exception": ["E"]}
    assert staged_keys(store) == []


def test_a_sqlite_file_of_the_release_before_replays_gains_the_column(tmp_path: Path) -> None:
    """The table was made without ``replays``: ``CREATE TABLE IF NOT EXISTS`` leaves it so, and
    every write of the index failed on the missing column."""
    path = tmp_path / "state.db"
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE dead_letter_index (id INTEGER PRIMARY KEY, ns TEXT NOT NULL, queue TEXT NOT NULL,"
            " message_id TEXT NOT NULL, actor TEXT NOT NULL, reason TEXT NOT NULL, exception TEXT NOT NULL,"
            " error TEXT NOT NULL, traceback TEXT NOT NULL, attempts INTEGER NOT NULL, enqueued_at INTEGER,"
            " failed_at INTEGER NOT NULL, copies INTEGER NOT NULL, UNIQUE (ns, queue, message_id))"
        )
        conn.execute(
            "INSERT INTO dead_letter_index VALUES (1, 'jobs:', 'q1', 'old', 'a1', 'rejected', '', '', '', 1,"
            " NULL, ?, 1)",
            (NOW,),
        )
    store = open_store(f"sqlite:///{path}")
    try:
        index = dead_letter_index(store)
        index.add([entry("q1", 1, replays=4)], ttl_ms=None, max_length=None)
        assert [(e.message_id, e.replays) for e in contents(index)[0]] == [("m1", 4), ("old", None)]
        assert dead_letter_index(open_store(f"sqlite:///{path}")).counts() == {"q1": 2}  # added once
    finally:
        store.close()
