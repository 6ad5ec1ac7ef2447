"""A batch of deferred writes retried after a store outage writes every group's items once.

A batch holds several kinds of write (a job's status and its key's completion, in the worker's
shared writer). When one group fails, a retry writes again what the failure undid: every group on
SQLite, whose transaction rolls back whole; on Redis, where each group's script stood as it
returned, only the failed group and those after it (a counter written twice counts twice).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import dramatiq
import pytest

from jobsystem.runtime.deferred import DeferredWrites
from jobsystem.store.base import StateStore, StoreUnavailable
from middleware.status import Status
from tests.unit.stub import RecordingBroker, delivery


class Flaky:
    """``write``, but its first ``failures`` calls raise, as a busy lock or a full disk would."""

    def __init__(self, write: Callable[..., None], failures: int = 1) -> None:
        self.write = write
        self.failures = failures
        self.calls = 0

    def __call__(self, *args: Any) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise StoreUnavailable("sqlite: OperationalError: database is locked")
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
