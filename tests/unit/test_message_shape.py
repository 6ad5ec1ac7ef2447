"""What the consumer checks of every body before anything reads its fields: each malformed shape
named by its field and problem, never its value, with the identifying fields salvaged."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from dramatiq import Message
from dramatiq.encoder import JSONEncoder
from hypothesis import given, settings
from hypothesis import strategies as st

from jobsystem.runtime.message_shape import Malformed, decode, int_option, loads

SECRET = "ana@example.com"


def body(**changes: Any) -> dict[str, Any]:
    good = {
        "queue_name": "work",
        "actor_name": "job",
        "args": [SECRET],
        "kwargs": {"to": SECRET},
        "options": {"retries": 1},
        "message_id": "m-1",
        "message_timestamp": 1_700_000_000_000,
    }
    return {**good, **changes}


def test_a_well_formed_body_is_the_message():
    message = decode(json.dumps(body()).encode(), "work")
    assert isinstance(message, Message) and message.args == (SECRET,) and message.options == {"retries": 1}


def test_the_decoded_message_is_the_one_dramatiq_would_build():
    """Built without the dataclass's ``__init__``: equal, copied, encoded and frozen as Dramatiq's."""
    built: Message[Any] = Message(**body())
    message = decode(json.dumps(body()).encode(), "work")
    assert isinstance(message, Message)
    assert message == built and message.asdict() == built.asdict()
    assert message.copy(queue_name="other") == built.copy(queue_name="other")
    assert Message.decode(message.encode()) == built
    with pytest.raises(AttributeError):
        message.queue_name = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("raw", "field", "problem"),
    [
        (b"\xff\xfe not utf-8", "body", "could not be decoded (not UTF-8 JSON)"),
        (b"{'not': 'json'}", "body", "could not be decoded (not UTF-8 JSON)"),
        (b"[1, 2]", "body", "must be a JSON object; got an array"),
        (json.dumps({**body(), "extra": SECRET}).encode(), "body", "has unexpected field(s): extra"),
        (json.dumps({**body(), SECRET: 1}).encode(), "body", "has unexpected field(s): 1 other(s)"),
    ],
)
def test_a_body_that_is_not_a_message_object(raw, field, problem):
    malformed = decode(raw, "work")
    assert isinstance(malformed, Malformed) and (malformed.field, malformed.problem) == (field, problem)


@pytest.mark.parametrize(
    ("changes", "field", "problem"),
    [
        (
            {"queue_name": "other"},
            "queue_name",
            "names another queue than the one the message was consumed from",
        ),
        ({"actor_name": ""}, "actor_name", "must be a non-empty string; got an empty string"),
        ({"message_id": "x" * 256}, "message_id", "longer than 255 bytes"),
        ({"message_id": "m\udc80"}, "message_id", "is not valid Unicode"),
        ({"args": {"a": SECRET}}, "args", "must be an array; got an object"),
        ({"kwargs": None}, "kwargs", "must be an object; got null"),
        ({"options": {"retries": "3"}}, "options.retries", "must be a non-negative integer; got a string"),
        (
            {"options": {"retries": -1}},
            "options.retries",
            "must be a non-negative integer; got a negative integer",
        ),
        (
            {"options": {"eta": float("inf")}},
            "options.eta",
            "must be a finite number of ms since 1970, at most 17 years ahead; got a non-finite number",
        ),
        (  # an eta in microseconds: the cascade could never hold it, only refuse it forever
            {"options": {"eta": int(time.time() * 1_000_000)}},
            "options.eta",
            "must be a finite number of ms since 1970, at most 17 years ahead; got an integer",
        ),
        ({"options": {"throws": "ValueError"}}, "options.throws", "must be absent"),
        ({"options": {"rate_limit_slot": {"bucket": "api"}}}, "options.rate_limit_slot", "must be an object"),
        (
            {"options": {"rate_limit_priority": 256}},
            "options.rate_limit_priority",
            "must be an integer from 0 to 255; got an integer",
        ),
        ({"options": {"pipe_target": {"queue_name": "q"}}}, "options.pipe_target.actor_name", "missing"),
        ({"message_timestamp": "yesterday"}, "message_timestamp", "must be an integer"),
    ],
)
def test_each_field_of_the_wrong_shape_is_named_without_its_value(changes, field, problem):
    malformed = decode(json.dumps(body(**changes)).encode(), "work")
    assert (
        isinstance(malformed, Malformed)
        and malformed.field == field
        and malformed.problem.startswith(problem)
    )
    assert SECRET not in str(malformed)


def test_a_missing_field_is_named():
    data = body()
    del data["message_timestamp"]
    malformed = decode(json.dumps(data).encode(), "work")
    assert isinstance(malformed, Malformed) and str(malformed) == "message_timestamp: missing"


def test_the_identifying_fields_that_are_well_formed_are_salvaged_for_the_record():
    malformed = decode(json.dumps(body(options=None)).encode(), "work")
    assert isinstance(malformed, Malformed)
    assert (malformed.message_id, malformed.actor_name, malformed.message_timestamp) == (
        "m-1",
        "job",
        1_700_000_000_000,
    )
    broken_id = decode(json.dumps(body(message_id=7, options=None)).encode(), "work")
    assert isinstance(broken_id, Malformed) and broken_id.message_id is None


def test_any_queue_is_accepted_when_none_is_given():
    assert isinstance(decode(json.dumps(body(queue_name="elsewhere")).encode(), None), Message)


def test_int_option_never_fails_on_what_it_reads():
    assert int_option({"attempts": 3}, "attempts") == 3
    options: object
    for options in (None, [], {"attempts": "3"}, {"attempts": True}, {}):
        assert int_option(options, "attempts", default=-1) == -1


#: JSON values as producers send them: unbounded integers, NaN and infinities (``json.dumps``
#: writes them), text with lone surrogates, nesting.
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=24,
)


def _outcome(decode_body: Any, body: bytes) -> str:
    """What decoding ``body`` gives, as comparable text: the value re-encoded (NaN, -0.0, int
    against float and key order all show), or that it raised."""
    try:
        return "value " + json.dumps(decode_body(body))
    except Exception:
        return "raised"


@settings(max_examples=400, deadline=None)
@given(_json_values, st.booleans())
def test_loads_gives_what_dramatiqs_encoder_gives(value: Any, ascii_only: bool):
    body = json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    assert _outcome(loads, body) == _outcome(JSONEncoder().decode, body)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40) | st.sampled_from([b'{"a":1,"a":2}', b"\xef\xbb\xbf{}", b"[" * 5000, b"1e400"]))
def test_loads_gives_what_dramatiqs_encoder_gives_for_any_bytes(body: bytes):
    assert _outcome(loads, body) == _outcome(JSONEncoder().decode, body)


def test_integers_beyond_64_bits_are_decoded_exact():
    """As the consumer decodes a body: orjson would read these as floats; they stay integers."""
    big = [2**64 + 1, -(2**63) - 1, 10**30]
    body = Message(queue_name="q", actor_name="a", args=(big, 1.5), kwargs={"n": 2**70}, options={}).encode()
    decoded = decode(body, "q")
    assert isinstance(decoded, Message)
    assert decoded.args == (big, 1.5) and decoded.kwargs == {"n": 2**70}
    assert all(type(n) is int for n in decoded.args[0])
