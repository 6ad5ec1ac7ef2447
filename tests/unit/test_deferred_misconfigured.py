"""Deferred writes to a store that refuses this configuration (a database index it lacks, refused
credentials, ``NOPERM``): each is dropped at its first answer, and said once.

Such an answer comes back on every retry until an operator mends the setting: retried as an
outage every 0.5 s, it held every later write of the process (every job's status, every key's
completion) behind it, with a WARNING each time. Dropped instead, the first drop is an ERROR line
naming the error by its class, the later ones DEBUG lines only, and the store taking writes again
says how many were lost meanwhile.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from redis._parsers.base import BaseParser

from jobsystem.runtime.deferred import DeferredWrites
from jobsystem.store.base import StateStore
from jobsystem.store.redis import RedisStore, redis_error
from tests.support import TEST_REDIS_URL

LOGGER = "jobsystem.runtime.deferred"

#: The test Redis, with a database index it does not have (it has 16).
NO_SUCH_DATABASE = TEST_REDIS_URL.rsplit("/", 1)[0] + "/999"


def set_keys(view: StateStore, keys: list[str]) -> None:
    for key in keys:
        view.set(key, "written")


def lines(caplog: pytest.LogCaptureFixture, event: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and r.getMessage() == event]


@pytest.fixture
def misconfigured() -> Iterator[RedisStore]:
    store = RedisStore(NO_SUCH_DATABASE, namespace="test-misconfigured:")
    yield store
    store.close()


def test_writes_a_store_refuses_are_dropped_at_once_and_said_once(
    misconfigured: RedisStore, caplog: pytest.LogCaptureFixture
) -> None:
    """``ERR DB index is out of range`` from the real Redis: both batches are dropped at their first
    answer (before, the first was retried for good and the second waited behind it)."""
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
    assert "out of range" not in str(first) and "6379" not in str(first)
    assert any("out of range" in str(vars(r)) for r in lines(caplog, "deferred_write_dropped_cause"))


class Refusing:
    """``set_keys`` on a store that refuses the client's credentials until ``mended``."""

    def __init__(self) -> None:
        self.mended = False
        self.error = redis_error(BaseParser.parse_error("NOAUTH Authentication required."))  # type: ignore[no-untyped-call]

    def __call__(self, view: StateStore, keys: list[str]) -> None:
        if not self.mended:
            raise self.error
        set_keys(view, keys)


def test_a_store_mended_takes_writes_again_and_says_how_many_were_lost(
    store: StateStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    refusing = Refusing()
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
    assert [store.get(key) for key in "abcde"] == [None, None, None, b"written", b"written"]
    (error,) = lines(caplog, "deferred_write_dropped")  # the others at DEBUG
    assert (error.levelno, error.code) == (logging.ERROR, "NOAUTH")  # type: ignore[attr-defined]
    (resumed,) = lines(caplog, "deferred_writes_resumed")
    assert (resumed.levelno, resumed.kind, resumed.dropped) == (logging.INFO, "Refusing", 3)  # type: ignore[attr-defined]
