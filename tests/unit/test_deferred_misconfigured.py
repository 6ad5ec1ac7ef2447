"""Deferred writes to a store that refuses this configuration (a database index it lacks, refused
credentials, ``NOPERM``): a write a guarantee rests on is kept until the store takes it, a
:func:`~jobsystem.runtime.deferred.best_effort` one dropped at its first answer; each kind said once.

Such an answer may come back on every retry until an operator mends the setting, or pass at once
(a proxy whose Redis restarted answers ``NOAUTH`` until a new connection logs in). A completion
dropped leaves its key pending, and a redelivered copy runs the job again: it is retried, each
pause doubled up to ``max_retry_delay``, its first refusal an ERROR line, later ones DEBUG lines
only. A status record or an index entry is dropped instead (retried as an outage every 0.5 s it
held every later write of the process behind it), the first drop an ERROR line naming the error by
its class, and the store taking writes again says how many were lost meanwhile.
"""

from __future__ import annotations

import logging
import threading
import time
import types
from collections.abc import Iterator

import pytest
from redis._parsers.base import BaseParser

import jobsystem.runtime.deferred as deferred_module
from jobsystem.rabbitmq.dead_letter_indexer import DeadLetterIndexer
from jobsystem.runtime.deferred import DeferredWrites, best_effort, is_best_effort
from jobsystem.store.base import StateStore
from jobsystem.store.redis import RedisStore, redis_error
from middleware.idempotency import _complete_many, _release_many
from middleware.status import Status
from tests.support import TEST_REDIS_URL
from tests.unit.test_deferred_writes import Flaky, in_one_batch

LOGGER = "jobsystem.runtime.deferred"

#: The test Redis, with a database index it does not have (it has 16).
NO_SUCH_DATABASE = TEST_REDIS_URL.rsplit("/", 1)[0] + "/999"

#: Refusals of this client's configuration, as redis-py raises them.
REFUSALS = [
    "NOAUTH Authentication required.",
    "WRONGPASS invalid username-password pair or user is disabled.",
    "ERR DB index is out of range",
    "NOPERM this user has no permissions to run the 'evalsha' command",
]


@best_effort
def set_keys(view: StateStore, keys: list[str]) -> None:
    """A kind of write no guarantee rests on, as a status record."""
    for key in keys:
        view.set(key, "written")


def complete_keys(view: StateStore, keys: list[str]) -> None:
    """A kind of write a guarantee rests on, as an idempotency completion."""
    for key in keys:
        view.set(key, "completed")


def lines(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and r.getMessage() == event]


@pytest.fixture
def misconfigured() -> Iterator[RedisStore]:
    store = RedisStore(NO_SUCH_DATABASE, namespace="test-misconfigured:")
    yield store
    store.close()


def test_best_effort_writes_a_store_refuses_are_dropped_at_once_and_said_once(
    misconfigured: RedisStore, caplog: pytest.LogCaptureFixture
) -> None:
    """``ERR DB index is out of range`` from the real Redis: both batches are dropped at their first
    answer (retried, the first held the second behind it for good)."""
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    writes = DeferredWrites(misconfigured, retry_delay=0.01)
    try:
        writes.submit(set_keys, "first")
        assert writes.flush(5), "retried as an outage"
        writes.submit(set_keys, "second")
        assert writes.flush(5), "retried as an outage"
    finally:
        writes.stop(timeout=0)
    assert lines(caplog, "deferred_writes_failed") == []
    dropped = lines(caplog, "deferred_write_dropped")
    assert [(r.levelno, r.writes) for r in dropped] == [(logging.ERROR, 1), (logging.DEBUG, 1)]  # type: ignore[attr-defined]
    first = vars(dropped[0])
    named = (first["kind"], first["error"], first["cause"], first["code"])
    assert named == (set_keys.__qualname__, "StoreMisconfigured", "ResponseError", "ERR")
    # The reply's text, and the store's address, go to the DEBUG twin only (kept out of Sentry).
    assert "out of range" not in _texts(first) and "6379" not in _texts(first)
    assert any("out of range" in str(vars(r)) for r in lines(caplog, "deferred_write_dropped_cause"))


class Tries:
    """``complete_keys``, counting its tries: ``tried`` is set at the ``enough``-th; once
    ``mended``, it writes nothing and returns (the writer's thread ends, as the test)."""

    def __init__(self, enough: int) -> None:
        self.enough, self.calls = enough, 0
        self.tried, self.mended = threading.Event(), False

    def __call__(self, view: StateStore, keys: list[str]) -> None:
        self.calls += 1
        if self.calls >= self.enough:
            self.tried.set()
        if not self.mended:
            complete_keys(view, keys)


def test_a_write_a_guarantee_rests_on_is_kept_while_the_real_store_refuses_it(
    misconfigured: RedisStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    tries = Tries(enough=4)  # set at the 4th try: the first three were answered and logged
    writes = DeferredWrites(misconfigured, retry_delay=0.01, max_retry_delay=0.05)
    try:
        writes.submit(tries, "order-1")
        assert tries.tried.wait(5)
        assert not writes.flush(0), "the completion was given up"
    finally:
        tries.mended = True
        writes.stop(timeout=5)
    assert writes.flush(0), "the completion was not kept to the end"
    assert lines(caplog, "deferred_write_dropped") == lines(caplog, "deferred_writes_failed") == []
    refused = lines(caplog, "deferred_writes_refused")
    assert [r.levelno for r in refused[:3]] == [logging.ERROR, logging.DEBUG, logging.DEBUG]
    first = vars(refused[0])
    named = (first["kind"], first["error"], first["code"], first["writes"])
    assert named == ("Tries", "StoreMisconfigured", "ERR", 1)
    assert "out of range" not in _texts(first) and "6379" not in _texts(first)


class Refusing:
    """``complete_keys`` on a store that refuses the client's credentials until ``mended`` (or
    for its first ``refusals`` calls)."""

    def __init__(self, refusals: int = 1_000_000) -> None:
        self.mended = False
        self.refusals = refusals
        self.error = redis_error(BaseParser.parse_error("NOAUTH Authentication required."))  # type: ignore[no-untyped-call]

    def __call__(self, view: StateStore, keys: list[str]) -> None:
        if not self.mended and self.refusals > 0:
            self.refusals -= 1
            raise self.error
        complete_keys(view, keys)


@best_effort
class RefusingStatus(Refusing):
    """The same refusals, of a kind of write no guarantee rests on."""


def test_a_store_mended_takes_best_effort_writes_again_and_says_how_many_were_lost(
    store: StateStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    refusing = RefusingStatus()
    writes = DeferredWrites(store, retry_delay=0.01)
    try:
        for key in ("a", "b", "c"):
            writes.submit(refusing, key)
            assert writes.flush(5), "retried as an outage"
        refusing.mended = True
        writes.submit(refusing, "d")
        assert writes.flush(5)
        writes.submit(refusing, "e")
        assert writes.flush(5)
    finally:
        writes.stop(timeout=0)
    assert [store.get(key) for key in "abcde"] == [None, None, None, b"completed", b"completed"]
    (error,) = lines(caplog, "deferred_write_dropped")  # the others at DEBUG
    assert (error.levelno, error.code) == (logging.ERROR, "NOAUTH")  # type: ignore[attr-defined]
    (resumed,) = lines(caplog, "deferred_writes_resumed")
    assert (resumed.levelno, resumed.kind, resumed.dropped) == (logging.INFO, "RefusingStatus", 3)  # type: ignore[attr-defined]


def test_a_kept_write_is_retried_with_pauses_doubling_to_the_bound_then_written(
    store: StateStore, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    pauses: list[float] = []
    writes = DeferredWrites(store, retry_delay=0.01, max_retry_delay=0.05)

    def sleep(seconds: float) -> None:  # this writer's pauses noted, not slept; any other's slept
        if threading.current_thread() is writes._thread:
            pauses.append(seconds)
        else:
            time.sleep(seconds)

    monkeypatch.setattr(deferred_module, "time", types.SimpleNamespace(sleep=sleep))
    refusing = Refusing(refusals=5)
    try:
        writes.submit(refusing, "order-1")
        assert writes.flush(5)
    finally:
        writes.stop(timeout=0)
    assert store.get("order-1") == b"completed"
    assert pauses == pytest.approx([0.01, 0.02, 0.04, 0.05, 0.05])
    levels = [r.levelno for r in lines(caplog, "deferred_writes_refused")]
    assert levels == [logging.ERROR] + [logging.DEBUG] * 4  # once per kind, not once per retry
    (resumed,) = lines(caplog, "deferred_writes_resumed")
    assert (resumed.kind, resumed.dropped) == ("Refusing", 0)  # type: ignore[attr-defined]


@best_effort
class FlakyStatus(Flaky):
    """A :class:`Flaky` kind of write no guarantee rests on."""


@pytest.mark.parametrize("reply", REFUSALS)
@pytest.mark.parametrize("kept", [True, False], ids=["guaranteed", "best_effort"])
def test_each_refusal_keeps_a_guaranteed_write_and_drops_a_best_effort_one(
    store: StateStore, reply: str, kept: bool
) -> None:
    error = redis_error(BaseParser.parse_error(reply))  # type: ignore[no-untyped-call]
    failing = (Flaky if kept else FlakyStatus)(complete_keys, failures=1 if kept else 1_000, error=error)
    writes = DeferredWrites(store, retry_delay=0.01)

    def submit() -> None:
        writes.submit(failing, "failing")
        writes.submit(set_keys, "after")

    try:
        in_one_batch(writes, submit)
    finally:
        writes.stop(timeout=0)
    assert store.get("after") == b"written"
    assert store.get("failing") == (b"completed" if kept else None)


def test_only_status_records_and_index_entries_are_best_effort() -> None:
    """What the project submits: a key's completion and release are kept (a guarantee rests on
    them), a status record and a dead-letter index entry may be dropped."""
    assert is_best_effort(Status._apply_updates) and is_best_effort(DeadLetterIndexer._add_many)
    assert not is_best_effort(_complete_many) and not is_best_effort(_release_many)


def _texts(fields: dict[str, object]) -> str:
    """A log record's text fields, joined: where a reply's text or the store's address would be
    (its numbers, a timestamp or a thread id, may hold the digits 6379 by chance)."""
    return " ".join(repr(value) for value in fields.values() if not isinstance(value, int | float))
