"""Review of fix/sentryaddr: a WARNING about a failed dependency names it by its error's class, the
error's text at DEBUG only. For the state store that class is always ``StoreUnavailable``
(:func:`jobsystem.store.redis.redis_error` wraps whatever redis-py raised), so an operator reading
the log at INFO can no longer tell a Redis that refuses connections from one that is full
(``OOM``), read-only after a failover (``READONLY``) or busy with a script (``BUSY``): before the
merge the line said ``redis: ResponseError: OOM command not allowed ...``. Neither redis-py's
class nor an error reply's code names a host or a port: the line says both, as ``cause`` and
``code`` (:func:`jobsystem.privacy.outage_lines.failure_fields`), the text in the DEBUG twin."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import redis
from redis._parsers.base import BaseParser

from jobsystem.privacy.outage_lines import log_outage
from jobsystem.store.base import StoreUnavailable
from jobsystem.store.redis import RedisStore
from middleware.store_check import StoreCheck
from tests.support import fresh_store

#: What redis-py raises when nothing listens, and when Redis answers a write with an error reply.
REFUSED = redis.ConnectionError("Error 111 connecting to 10.0.0.5:6379. Connection refused.")
FULL = redis.ResponseError("OOM command not allowed when used memory > 'maxmemory'.")


def named(line: logging.LogRecord) -> tuple[str, ...]:
    """What a line says of its error at its own level."""
    return tuple(str(getattr(line, f, "")) for f in ("error", "cause", "code"))


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
        assert isinstance(store, RedisStore)  # fresh_store("redis")
        with pytest.raises(StoreUnavailable) as failure, store.errors():
            store.client.evalsha("0" * 40, 0)  # a real error reply, as redis-py parses it
        check._unavailable(failure.value)
    lines = [r for r in caplog.records if r.getMessage() == "state_store_unavailable"]
    assert [r.levelno for r in lines] == [logging.WARNING] * 3
    refused, full, unknown_script = (named(r) for r in lines)
    assert "10.0.0.5" not in str(refused + full)  # the address stays at DEBUG
    assert refused == ("StoreUnavailable", "ConnectionError", "")
    assert full == ("StoreUnavailable", "ResponseError", "OOM")
    assert unknown_script == ("StoreUnavailable", "NoScriptError", "NOSCRIPT")


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (REFUSED, {"cause": "ConnectionError"}),
        (redis.TimeoutError("Timeout reading from 10.0.0.5:6379"), {"cause": "TimeoutError"}),
        # Replies as redis-py parses them: the classes it maps lose their code from the text.
        (BaseParser.parse_error("OOM command not allowed"), {"cause": "OutOfMemoryError", "code": "OOM"}),  # type: ignore[no-untyped-call]
        (
            BaseParser.parse_error("READONLY You can't write against a read only replica."),  # type: ignore[no-untyped-call]
            {"code": "READONLY"},
        ),
        (BaseParser.parse_error("BUSY Redis is busy running a script."), {"code": "BUSY"}),  # type: ignore[no-untyped-call]
        (BaseParser.parse_error("LOADING Redis is loading the dataset"), {"code": "LOADING"}),  # type: ignore[no-untyped-call]
        # An older redis-py (no status_code): the code from the class it maps the reply to.
        (
            redis.exceptions.ReadOnlyError("You can't write against a read only replica."),
            {"code": "READONLY"},
        ),
        (FULL, {"cause": "ResponseError", "code": "OOM"}),  # unparsed: the text's first word
        (redis.ResponseError("10.0.0.5:6379 refused the key"), {"code": None}),  # not a word
        (redis.ResponseError("ABCDEFGHIJKLMNOPQRSTUVWXYZ said no"), {"code": None}),  # too long
        (redis.ResponseError("Kim's key at 10.0.0.5 is wrong"), {"code": None}),  # not capitals
    ],
)
def test_a_store_failure_is_named_by_its_cause_and_reply_code_never_by_its_text(
    raised: redis.RedisError, expected: dict[str, str | None], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=__name__)
    try:
        try:
            raise raised
        except redis.RedisError as exc:
            raise StoreUnavailable(f"redis: {type(exc).__name__}: {exc}") from exc
    except StoreUnavailable as exc:
        wrapper = exc
        log_outage(logging.getLogger(__name__), logging.WARNING, "store_down", exc, queue="q")
    line, twin = caplog.records
    fields = {k: getattr(line, k, None) for k in ("queue", "error", "cause", "code")}
    assert fields["error"] == "StoreUnavailable" and fields["cause"] == type(raised).__name__
    assert {k: fields[k] for k in expected} == expected
    assert not any(
        word in str(fields) for word in ("10.0.0.5", "Kim", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "busy", "command")
    )
    # The twin at DEBUG: the same fields, the error's text.
    assert (twin.getMessage(), twin.levelno, twin.error) == ("store_down_cause", logging.DEBUG, str(wrapper))  # type: ignore[attr-defined]
    assert {k: getattr(twin, k, None) for k in ("queue", "cause", "code")} == {
        k: fields[k] for k in ("queue", "cause", "code")
    }


def test_an_error_that_wraps_none_is_named_by_its_class_alone(caplog: pytest.LogCaptureFixture) -> None:
    """pika's, SMTP's or a store error raised with no cause: no ``cause``, no ``code``."""
    caplog.set_level(logging.WARNING, logger=__name__)
    for exc in (ConnectionRefusedError(111, "Connection refused"), StoreUnavailable("redis: down")):
        log_outage(logging.getLogger(__name__), logging.WARNING, "down", exc)
    assert [(r.error, hasattr(r, "cause"), hasattr(r, "code")) for r in caplog.records] == [  # type: ignore[attr-defined]
        ("ConnectionRefusedError", False, False),
        ("StoreUnavailable", False, False),
    ]
