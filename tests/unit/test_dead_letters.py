"""The record a dead letter carries (``DeadLetters``), built from what the worker knows of the
last attempt, for every reason a message fails for good; and the application's hook told of it."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import dramatiq
import pytest
from dramatiq.errors import ActorNotFound
from dramatiq.middleware import AgeLimit, Retries, SkipMessage
from dramatiq.middleware.time_limit import TimeLimitExceeded

from jobsystem.dramatiq_internals import reject
from jobsystem.runtime.message_shape import Malformed
from middleware.dead_letters import ATTEMPTS, HEADER_FIELD, DeadLetters
from tests.unit.stub import RecordingBroker, delivery


class Permanent(Exception):
    """Never worth a retry."""


@pytest.fixture
def broker() -> RecordingBroker:
    broker = RecordingBroker(middleware=[AgeLimit(), DeadLetters(), Retries()])
    dramatiq.actor(broker=broker, actor_name="job", queue_name="work", throws=(Permanent,), max_age=60_000)(
        lambda *args: None
    )
    dramatiq.actor(broker=broker, actor_name="told", queue_name="work")(lambda **kwargs: None)
    return broker


def headers(broker: RecordingBroker, proxy: Any, error: BaseException | None, **scrub: Any) -> dict[str, Any]:
    return DeadLetters(**scrub).record(broker, proxy, error)


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (RuntimeError("still down"), "retries_exhausted"),
        (Permanent("no such account"), "non_retryable"),
        (TimeLimitExceeded(), "time_limit"),
        (ActorNotFound("gone"), "unknown_actor"),  # type: ignore[no-untyped-call]
        (None, "rejected"),
    ],
)
def test_the_reason_follows_from_the_last_attempt(broker, error, reason):
    proxy = delivery(dramatiq.Message("work", "job", (1,), {}, {ATTEMPTS: 3}))
    record = headers(broker, proxy, error)
    assert record["x-dl-reason"] == reason and record["x-dl-attempts"] == 3
    assert record["x-dl-exception"] == (type(error).__name__ if error is not None else "")
    assert (record["x-dl-queue"], record["x-dl-actor"]) == ("work", "job")


def test_a_message_past_its_max_age_is_dead_for_its_age(broker):
    old: dramatiq.Message[Any] = dramatiq.Message(
        "work", "job", (), {}, {}, message_timestamp=int(time.time() * 1000) - 120_000
    )
    assert headers(broker, delivery(old), SkipMessage("too old"))["x-dl-reason"] == "age_limit"


def test_a_middleware_that_rejects_names_the_reason_and_the_error_it_had(broker):
    proxy = delivery(dramatiq.Message("work", "job", (), {}, {}))
    reject(proxy, "rejected", error=ValueError("key function failed for ana@example.com"))
    record = headers(
        broker, proxy, SkipMessage("rejected"), scrub=lambda t: t.replace("ana@example.com", "[email]")
    )
    assert proxy.failed and record["x-dl-reason"] == "rejected"
    assert (record["x-dl-exception"], record["x-dl-error"]) == (
        "ValueError",
        "key function failed for [email]",
    )
    assert "ValueError" in record["x-dl-traceback"] and "ana@example.com" not in record["x-dl-traceback"]


def test_the_traceback_keeps_its_tail(broker):
    try:
        raise RuntimeError("x" * 20_000 + " the end")
    except RuntimeError as error:
        record = headers(
            broker, delivery(dramatiq.Message("work", "job", (), {}, {})), error, max_traceback=500
        )
    assert len(record["x-dl-traceback"]) == 500 and record["x-dl-traceback"].rstrip().endswith("the end")


def test_attempts_are_counted_as_they_reach_the_actor(broker):
    proxy = delivery(dramatiq.Message("work", "job", (), {}, {}))
    for _ in range(2):
        DeadLetters().before_process_message(broker, proxy)
    assert proxy.options[ATTEMPTS] == 2


def test_a_malformed_body_is_recorded_without_its_value(broker):
    malformed = Malformed("options.retries", "must be a non-negative integer; got a string", message_id="m1")
    record = DeadLetters().malformed_record(broker, "work", malformed)
    assert (record["x-dl-reason"], record["x-dl-exception"]) == ("malformed", "MalformedMessage")
    assert record[HEADER_FIELD] == "options.retries" and record["x-dl-attempts"] == 0
    assert record["x-dl-error"] == "options.retries: must be a non-negative integer; got a string"


def test_the_on_dead_letter_hook_is_told_which_job_failed(broker):
    proxy = delivery(dramatiq.Message("work", "job", ("a",), {"to": "b"}, {"on_dead_letter": "told"}))
    record = headers(broker, proxy, Permanent("no"))
    told = DeadLetters().notify(broker, proxy, record)
    assert told is not None and told.actor_name == "told"
    assert told.kwargs == {
        "message_id": proxy.message_id,
        "actor": "job",
        "reason": "non_retryable",
        "exception": "Permanent",
        "error": "no",
        "args": ["a"],
        "kwargs": {"to": "b"},
    }


@pytest.mark.parametrize("name", ["Ana_Lopez_1980", "ana@example.com"])
def test_the_on_dead_letter_hook_of_a_message_naming_no_actor_is_told_unknown(broker, name):
    """A message naming no registered actor (the sender's text, a person's name) is dead for its
    actor; its hook is the application's own code, but it logs or alerts with what it is told:
    the name is labelled as in every other output."""
    proxy = delivery(dramatiq.Message("work", name, (), {}, {"on_dead_letter": "told"}))
    record = headers(broker, proxy, ActorNotFound(name))  # type: ignore[no-untyped-call]
    told = DeadLetters().notify(broker, proxy, record)
    assert told is not None and told.actor_name == "told"
    assert (told.kwargs["actor"], told.kwargs["reason"]) == ("unknown", "unknown_actor")
    assert name not in repr(told.kwargs)


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for this error")


def test_building_a_record_never_fails_whatever_the_message_holds(broker):
    odd = [
        SimpleNamespace(),  # every field missing
        SimpleNamespace(options=None, queue_name=5, actor_name=["a"], message_timestamp="yesterday"),
        SimpleNamespace(
            options={"attempts": "3"}, queue_name=None, actor_name=None, message_timestamp=10**30
        ),
        SimpleNamespace(options=[], queue_name="q\udc80", actor_name="a\udc80", message_timestamp=None),
    ]
    for message in odd:
        for error in (None, _Unprintable(), ValueError("bad \udc80 value")):
            record = DeadLetters().record(broker, message, error)
            assert record["x-dl-reason"] in ("rejected", "retries_exhausted", "unknown_actor")
            assert record["x-dl-attempts"] == 0
            for value in record.values():  # AMQP can carry every value
                assert isinstance(value, int) or isinstance(value.encode("utf-8"), bytes)
