"""A batch of deferred writes retried after a store outage writes every group's items once; a
group that fails for good is dropped alone.

A batch holds several kinds of write (a job's status and its key's completion, in the worker's
shared writer). When one group fails, a retry writes again what the failure undid: every group on
SQLite, whose transaction rolls back whole; on Redis, where each group's script stood as it
returned, only the failed group and those after it (a counter written twice counts twice).

Only a failure that passes is retried (a lost connection, ``OOM``, ``READONLY``, a locked SQLite
file). One that would come back on every retry (``WRONGTYPE``, a script's error, a bug) held every
later write of the process behind it for good, and a plain exception dropped the whole batch.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dramatiq
import pytest
import redis
from redis._parsers.base import BaseParser

from jobsystem.runtime.deferred import DeferredWrites
from jobsystem.store.base import StateStore
from jobsystem.store.idempotency import KEY_PREFIX, idempotency_backend
from jobsystem.store.redis import RedisStore, redis_error
from jobsystem.store.sqlite import sqlite_error
from middleware.status import Status
from tests.support import fresh_store
from tests.unit.stub import RecordingBroker, delivery

#: A busy SQLite file, as the store reports it: a failure that passes.
LOCKED = sqlite_error(sqlite3.OperationalError("database is locked"))


class Flaky:
    """``write``, but its first ``failures`` calls raise ``error`` (by default a busy lock)."""

    def __init__(self, write: Callable[..., None], failures: int = 1, error: Exception = LOCKED) -> None:
        self.write = write
        self.failures = failures
        self.error = error
        self.calls = 0

    def __call__(self, *args: Any) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        self.write(*args)


def set_keys(view: StateStore, keys: list[str]) -> None:
    for key in keys:
        view.set(key, "written")


def count_up(view: StateStore, keys: list[str]) -> None:
    """A counter per key: applied twice, it counts two."""
    for key in keys:
        view.set(key, str(int(view.get(key) or 0) + 1))


@pytest.fixture
def writes(store: StateStore) -> Iterator[DeferredWrites]:
    deferred = DeferredWrites(store, retry_delay=0.01)
    yield deferred
    deferred.stop()


def in_one_batch(writes: DeferredWrites, submit: Callable[[], Any]) -> None:
    """Call ``submit`` while the writer's thread is inside a batch of its own: everything it
    submits is pending when the thread takes its next batch, so it leaves together, in order."""
    entered, release = threading.Event(), threading.Event()

    def hold(view: StateStore, items: list[None]) -> None:
        entered.set()
        release.wait(10)

    writes.submit(hold, None)
    assert entered.wait(10)
    try:
        submit()
    finally:
        release.set()
    assert writes.flush(10)


@pytest.mark.parametrize("failing", ["a later group", "its own group"])
def test_a_status_update_reaches_the_record_when_its_batch_is_retried(store, writes, failing, monkeypatch):
    """Status's group first (its hooks run before Idempotency's), a key's completion after it: on
    SQLite the completion's failure rolled back the status update, which the retry must write."""
    status = Status(store, writes=writes)
    broker = RecordingBroker(middleware=[status])
    actor = dramatiq.actor(broker=broker, actor_name="job", queue_name="q")(lambda: None)
    message = actor.message()
    running = delivery(message)
    status.before_process_message(broker, running)
    assert status.flush(10)
    later = Flaky(set_keys, failures=1 if failing == "a later group" else 0)
    if failing == "its own group":
        monkeypatch.setattr(status.backend, "apply", Flaky(status.backend.apply))

    def finish() -> None:
        status.after_process_message(broker, running, result=7)
        writes.submit(later, "completion")

    in_one_batch(writes, finish)
    record = status.get(message.message_id)
    assert record is not None and (record.state, record.result) == ("succeeded", 7)
    assert status.backend.counts(["q"])["q"] == {"running": 1, "succeeded": 1}
    assert store.get("completion") == b"written"


def test_a_group_written_before_a_later_group_failed_is_written_once(store, writes):
    later = Flaky(set_keys)

    def submit() -> None:
        writes.submit(count_up, "count")
        writes.submit(later, "completion")

    in_one_batch(writes, submit)
    assert later.calls == 2 and store.get("completion") == b"written"
    assert store.get("count") == b"1"


def complete_keys(view: StateStore, items: list[tuple[str, str | None, int]]) -> None:
    """Idempotency keys' completions, as the worker's Idempotency middleware defers them."""
    idempotency_backend(view).complete_many(items)


class Job:
    """A job of the Status middleware on ``writes``: ``start()`` submits its status update (a
    :class:`Buffered` kind of write), ``state()`` reads what its record holds."""

    def __init__(self, store: StateStore, writes: DeferredWrites) -> None:
        self.status = Status(store, writes=writes)
        self.broker = RecordingBroker(middleware=[self.status])
        actor = dramatiq.actor(broker=self.broker, actor_name="job", queue_name="q")(lambda: None)
        self.message = actor.message()

    def start(self) -> None:
        self.status.before_process_message(self.broker, delivery(self.message))

    def state(self) -> str | None:
        record = self.status.get(self.message.message_id)
        return None if record is None else record.state


def dropped_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage() == "deferred_write_dropped"]


@pytest.fixture
def redis_store(tmp_path: Path) -> Iterator[RedisStore]:
    """The test Redis in a namespace of the test's own, deleted after (a failed test's too)."""
    with fresh_store("redis", tmp_path) as store:
        assert isinstance(store, RedisStore)
        yield store


def test_a_key_of_the_wrong_type_no_longer_holds_up_the_writes_after_it(
    redis_store: RedisStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A completion whose key holds a string answers WRONGTYPE, every time: retried as an outage,
    it held every later write of the process (the next job's status) behind it for good."""
    writes = DeferredWrites(redis_store, retry_delay=0.01)
    try:
        redis_store.client.set(redis_store.key(KEY_PREFIX + "poisoned"), "not a hash")
        writes.submit(complete_keys, ("poisoned", "null", 60_000))
        job = Job(redis_store, writes)
        job.start()
        assert writes.flush(5), "the next job's status update is held behind the completion"
        assert job.state() == "running"
        assert redis_store.client.get(redis_store.key(KEY_PREFIX + "poisoned")) == b"not a hash"
    finally:
        writes.stop(timeout=0)
    (line,) = dropped_lines(caplog)
    fields = (line.levelno, line.kind, line.writes, line.code)  # type: ignore[attr-defined]
    assert fields == (logging.ERROR, complete_keys.__qualname__, 1, "WRONGTYPE")


def test_a_group_that_raises_is_dropped_alone(
    store: StateStore, writes: DeferredWrites, caplog: pytest.LogCaptureFixture
) -> None:
    """A kind of write that raises a plain exception (a bug) loses its own writes, not those of
    the kinds batched with it: before, the whole batch was dropped (a job's status update with it),
    and on SQLite the rollback undid the groups written before it too."""
    job = Job(store, writes)
    calls: list[list[str]] = []

    def broken(view: StateStore, items: list[str]) -> None:
        calls.append(items)
        raise ValueError(f"cannot write {items}")

    def submit() -> None:
        writes.submit(count_up, "count")
        job.start()
        writes.submit(broken, "secret-item")
        writes.submit(set_keys, "completion")

    in_one_batch(writes, submit)
    assert store.get("count") == b"1" and store.get("completion") == b"written"
    assert job.state() == "running"
    assert calls[0] == ["secret-item"]
    (line,) = dropped_lines(caplog)
    fields = (line.levelno, line.kind, line.writes, line.error)  # type: ignore[attr-defined]
    assert fields == (logging.ERROR, broken.__qualname__, 1, "ValueError")
    assert "secret-item" not in line.getMessage()


@pytest.mark.parametrize(
    ("reply", "passes"),
    [
        ("OOM command not allowed when used memory > 'maxmemory'.", True),
        ("READONLY You can't write against a read only replica.", True),
        ("BUSY Redis is busy running a script.", True),
        ("LOADING Redis is loading the dataset in memory", True),
        ("MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist", True),
        (redis.ConnectionError("Connection reset by peer"), True),
        (redis.TimeoutError("Timeout reading from socket"), True),
        ("WRONGTYPE Operation against a key holding the wrong kind of value", False),
        ("ERR value is not an integer or out of range", False),
        ("ERR user_script:3: Script attempted to access a non local key", False),
    ],
)
def test_an_error_reply_is_retried_only_when_it_means_try_later(
    store: StateStore, writes: DeferredWrites, reply: str | redis.RedisError, passes: bool
) -> None:
    """A lost connection, a timeout, an OOM, READONLY, LOADING or MISCONF (a full disk) reply is an
    outage: the group is written again once the store answers. Any other reply comes back the same
    on every retry: the group is dropped, not retried, and the group after it written (a
    misconfigured store's refusals: ``test_deferred_misconfigured``)."""
    raised = reply if isinstance(reply, redis.RedisError) else BaseParser.parse_error(reply)  # type: ignore[no-untyped-call]
    error = redis_error(raised)
    failing = Flaky(set_keys, failures=1 if passes else 1_000, error=error)

    def submit() -> None:
        writes.submit(failing, "failing")
        writes.submit(set_keys, "after")

    in_one_batch(writes, submit)
    assert store.get("after") == b"written"
    if passes:
        assert (failing.calls, store.get("failing")) == (2, b"written")
    else:  # tried once more on its own on SQLite, where the batch's rollback undid it with the rest
        assert (failing.calls, store.get("failing")) == (2 if store.atomic_batch else 1, None)
