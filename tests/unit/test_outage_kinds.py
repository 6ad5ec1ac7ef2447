"""Review of fix/sentryaddr: a WARNING about a failed dependency names it by its error's class, the
error's text at DEBUG only. For the state store that class is always ``StoreUnavailable``
(:func:`jobsystem.store.redis.redis_error` wraps whatever redis-py raised), so an operator reading
the log at INFO can no longer tell a Redis that refuses connections from one that is full
(``OOM``), read-only after a failover (``READONLY``) or busy with a script (``BUSY``): before the
merge the line said ``redis: ResponseError: OOM command not allowed ...``. Neither redis-py's
class nor an error reply's code names a host or a port."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import redis

from jobsystem.store.base import StoreUnavailable
from middleware.store_check import StoreCheck
from tests.support import fresh_store

#: What redis-py raises when nothing listens, and when Redis answers a write with an error reply.
REFUSED = redis.ConnectionError("Error 111 connecting to 10.0.0.5:6379. Connection refused.")
FULL = redis.ResponseError("OOM command not allowed when used memory > 'maxmemory'.")


@pytest.mark.xfail(
    strict=True,
    reason="review1: log_outage (jobsystem/privacy/outage_lines.py:36) keeps only type(exc).__name__, "
    "StoreUnavailable for every store failure",
)
def test_an_operator_at_info_can_tell_a_refused_redis_from_a_full_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    with fresh_store("redis", tmp_path) as store:
        check = StoreCheck(store, setting="STATE_URL")
        for raised in (REFUSED, FULL):
            with pytest.raises(StoreUnavailable) as failure, store.errors():
                raise raised
            check._unavailable(failure.value)
    lines = [r for r in caplog.records if r.getMessage() == "state_store_unavailable"]
    assert [r.levelno for r in lines] == [logging.WARNING, logging.WARNING]
    refused, full = (str(getattr(r, "error", "")) for r in lines)
    assert "10.0.0.5" not in refused + full  # the address stays at DEBUG
    assert refused != full, (refused, full)
