"""The shape of a message as it arrives off a queue, checked before anything reads its fields.

Dramatiq trusts a body that decodes: ``Message(**fields)`` takes whatever types the JSON holds, and
the worker, Dramatiq's middleware and the project's then fail in odd places. ``"options": null``
crashes the consumer thread (and RabbitMQ redelivers the body to it forever), a ``queue_name`` of
another queue kills the worker thread that acks it, a missing ``message_id`` gets a fresh one on
every delivery, a string ``options.retries`` makes every retry fail to publish. So the consumer
decodes each body with :func:`decode` and sends what does not fit to the dead letters (reason
``malformed``) instead of to a worker thread.

A :class:`Malformed` says which field is wrong and how, never its value (bodies carry personal
data), and salvages the identifying fields that are themselves well formed.

Options that Dramatiq or this project's middleware read are checked when present
(:data:`OPTION_SHAPES`); other options are the application's business and pass as they are.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import orjson
from dramatiq import Message
from dramatiq.encoder import JSONEncoder
from dramatiq.message import get_encoder

from jobsystem.runtime.delay_range import MAX_DELAY_MS

__all__ = [
    "FIELDS",
    "OPTION_SHAPES",
    "Malformed",
    "decode",
    "int_option",
    "is_priority",
    "loads",
    "problem_of",
]

#: The fields of a message body, all required (Dramatiq always sends them).
FIELDS = ("queue_name", "actor_name", "args", "kwargs", "options", "message_id", "message_timestamp")
_FIELD_SET = frozenset(FIELDS)

#: AMQP's limit on a ``short string`` (the message id goes into the ``message-id`` property).
MAX_MESSAGE_ID_BYTES = 255

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,40}")
#: A body with each ASCII digit as ``1`` and every other byte as ``0``, and a run of digits enough
#: for an integer outside 64 bits (every integer of 18 digits or fewer is inside): ``translate``
#: and ``find`` scan a body in well under a microsecond, a regular expression takes several.
_DIGITS_AS_ONES = bytes(49 if 48 <= byte <= 57 else 48 for byte in range(256))
_LONG_DIGIT_RUN = b"1" * 19


def _has_long_digit_run(body: bytes) -> bool:
    return body.translate(_DIGITS_AS_ONES).find(_LONG_DIGIT_RUN) >= 0


@dataclass(frozen=True)
class Malformed:
    """A body that is not a well-formed message for the queue it was consumed from.

    Parameters:
      field: what is wrong, as a path (``body``, ``message_id``, ``options.retries``).
      problem: how, without the value (``missing``, ``must be a string; got an integer``).
      message_id, actor_name, message_timestamp: those fields when they are themselves well
        formed, else None (for the dead letter's record).
    """

    field: str
    problem: str
    message_id: str | None = None
    actor_name: str | None = None
    message_timestamp: int | None = None

    def __str__(self) -> str:
        return f"{self.field}: {self.problem}"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_priority(value: Any) -> bool:
    """Whether ``value`` is an AMQP message priority (``broker_priority``)."""
    return _is_int(value) and 0 <= value <= 255


def _is_number(value: Any) -> bool:
    return _is_int(value) or (isinstance(value, float) and math.isfinite(value))


def _non_negative_int(value: Any) -> bool:
    return _is_int(value) and value >= 0


def _non_negative_number(value: Any) -> bool:
    return _is_number(value) and value >= 0


def _non_empty_str(value: Any) -> bool:
    return isinstance(value, str) and value != ""


def _slot(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("bucket"), str) and _is_int(value.get("at"))


def _absent(value: Any) -> bool:
    return False


#: How far ahead an ``eta`` may lie: the delay cascade's reach, 17 years. One further off (an eta
#: in microseconds) could never be scheduled, only refused forever, so it is malformed.
ETA_REACH_MS = MAX_DELAY_MS


def _eta(value: Any) -> bool:
    return _is_number(value) and value - time.time() * 1000 <= ETA_REACH_MS


#: A check and what it expects, as told in the dead letter's error.
Shape = tuple[Callable[[Any], bool], str]

_NON_NEGATIVE_INT: Shape = (_non_negative_int, "a non-negative integer")
_NON_NEGATIVE_NUMBER: Shape = (_non_negative_number, "a non-negative number")
_NUMBER: Shape = (_is_number, "a finite number")
_INT: Shape = (_is_int, "an integer")
_STR: Shape = (lambda v: isinstance(v, str), "a string")
_NAME: Shape = (_non_empty_str, "a non-empty string")
_BOOL: Shape = (lambda v: isinstance(v, bool), "true or false")
_OBJECT: Shape = (lambda v: isinstance(v, dict), "an object")
_PRIORITY: Shape = (is_priority, "an integer from 0 to 255")

#: Options read by Dramatiq's middleware or the project's, with the shape each must have when
#: present and not null. ``throws`` and ``retry_when`` hold code: only an actor can set them.
OPTION_SHAPES: Mapping[str, Shape] = {
    # Dramatiq: Retries, AgeLimit, TimeLimit, Callbacks, Pipelines, ShutdownNotifications, broker
    "retries": _NON_NEGATIVE_INT,
    "max_retries": _NON_NEGATIVE_INT,
    "min_backoff": _NON_NEGATIVE_NUMBER,
    "max_backoff": _NON_NEGATIVE_NUMBER,
    "max_age": _NON_NEGATIVE_NUMBER,
    "time_limit": _NON_NEGATIVE_NUMBER,
    "eta": (_eta, "a finite number of ms since 1970, at most 17 years ahead"),
    "requeue_timestamp": _INT,
    "traceback": _STR,
    "throws": (_absent, "absent (exception classes cannot travel in a message)"),
    "retry_when": (_absent, "absent (a callable cannot travel in a message)"),
    "on_success": _NAME,
    "on_failure": _NAME,
    "on_retry_exhausted": _NAME,
    "pipe_target": _OBJECT,
    "pipe_ignore": _BOOL,
    "notify_shutdown": _BOOL,
    "broker_priority": _PRIORITY,
    # The project: dead letters, idempotency, rate limits, scheduler
    "attempts": _NON_NEGATIVE_INT,
    "replays": _NON_NEGATIVE_INT,
    "on_dead_letter": _NAME,
    "idempotency_key": (lambda v: isinstance(v, str) or _is_int(v), "a string or an integer"),
    "idempotency_ttl": (lambda v: _is_int(v) and v > 0, "a positive integer"),
    "idempotency_drop_duplicates": _BOOL,
    "idempotency_registered": _BOOL,
    "idempotency_store_waits": _NON_NEGATIVE_INT,
    "rate_limit": _NAME,
    "rate_limit_cost": (lambda v: _is_number(v) and v > 0, "a positive number"),
    # Only its shape is checked here: the store honours a slot only while it is on record for the
    # message id (jobsystem.store.buckets), so one a sender wrote itself is ignored, not trusted.
    "rate_limit_slot": (_slot, 'an object {"bucket": string, "at": integer}'),
    "rate_limit_store_waits": _NON_NEGATIVE_INT,
    # The priority a message had before it was promoted for its slot (middleware.slot_priority).
    "rate_limit_priority": _PRIORITY,
    "duplicate": _BOOL,
    "schedule": _STR,
    "fire_time": _STR,
}


def _described(value: Any) -> str:
    """A value's JSON type, never the value itself."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if _is_int(value):
        return "an integer" if value >= 0 else "a negative integer"
    if isinstance(value, float):
        return "a number" if math.isfinite(value) else "a non-finite number"
    if isinstance(value, str):
        return "an empty string" if value == "" else "a string"
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _expected(field: str, what: str, value: Any) -> Malformed:
    return Malformed(field, f"must be {what}; got {_described(value)}")


def _names(keys: list[Any]) -> str:
    """Unexpected key names when they look like identifiers (else only how many): a key could
    in principle be data."""
    shown = [k for k in keys if isinstance(k, str) and _IDENTIFIER.fullmatch(k)]
    hidden = len(keys) - len(shown)
    return ", ".join(shown[:5] + ([f"{hidden} other(s)"] if hidden else []))


def _check_options(options: dict[str, Any], path: str) -> Malformed | None:
    # A message carries a few of the known options: look those up, not every known one.
    for name, value in options.items():
        shape = OPTION_SHAPES.get(name)
        if shape is not None and value is not None and not shape[0](value):
            return _expected(f"{path}.{name}", shape[1], value)
    pipe_target = options.get("pipe_target")
    if pipe_target is not None:
        return problem_of(pipe_target, None, path=f"{path}.pipe_target")
    return None


def _check_field(name: str, value: Any, queue_name: str | None, prefix: str) -> Malformed | None:
    # Every delivery passes here: the field's path is made only for an error.
    if name == "queue_name":
        if not isinstance(value, str):
            return _expected(prefix + name, "a string", value)
        if queue_name is not None and value != queue_name:
            return Malformed(prefix + name, "names another queue than the one the message was consumed from")
    elif name in ("actor_name", "message_id"):
        if not _non_empty_str(value):
            return _expected(prefix + name, "a non-empty string", value)
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError:  # a lone surrogate: AMQP could not carry it in a property
            return Malformed(prefix + name, "is not valid Unicode")
        if name == "message_id" and size > MAX_MESSAGE_ID_BYTES:
            return Malformed(prefix + name, f"longer than {MAX_MESSAGE_ID_BYTES} bytes")
    elif name == "args":
        if not isinstance(value, list | tuple):
            return _expected(prefix + name, "an array", value)
    elif name in ("kwargs", "options"):
        if not isinstance(value, dict):
            return _expected(prefix + name, "an object", value)
        if not all(map(isinstance, value, repeat(str))):  # a C loop, unlike a generator
            return Malformed(prefix + name, "must have string keys")
        if name == "options":
            return _check_options(value, prefix + name)
    elif name == "message_timestamp" and not _is_int(value):
        return _expected(prefix + name, "an integer (milliseconds since 1970)", value)
    return None


def problem_of(data: Any, queue_name: str | None, *, path: str = "") -> Malformed | None:
    """What is wrong with decoded message ``data`` consumed from ``queue_name`` (None: any queue),
    or None when it is a well-formed message."""
    if not isinstance(data, dict):
        return _expected(path or "body", "a JSON object", data)
    unknown = [] if _FIELD_SET.issuperset(data) else [key for key in data if key not in _FIELD_SET]
    if unknown:
        return Malformed(path or "body", f"has unexpected field(s): {_names(unknown)}")
    prefix = f"{path}." if path else ""
    for name in FIELDS:
        if name not in data:
            return Malformed(f"{prefix}{name}", "missing")
        problem = _check_field(name, data[name], queue_name, prefix)
        if problem is not None:
            return problem
    return None


def _salvaged(data: Any, problem: Malformed) -> Malformed:
    """``problem`` with the identifying fields of ``data`` that are themselves well formed."""
    if not isinstance(data, dict):
        return problem
    message_id, actor_name, timestamp = (
        data.get(k) for k in ("message_id", "actor_name", "message_timestamp")
    )
    return Malformed(
        problem.field,
        problem.problem,
        message_id=message_id if _check_field("message_id", message_id, None, "") is None else None,
        actor_name=actor_name if _check_field("actor_name", actor_name, None, "") is None else None,
        message_timestamp=timestamp if _is_int(timestamp) else None,
    )


def loads(body: bytes) -> Any:
    """The decoded ``body``, as Dramatiq's encoder decodes it (which raises what it raises).

    With Dramatiq's JSON encoder (the default), ``orjson`` first: on the consumer's thread, which
    every delivery passes, it takes a fifth of the time of ``json.loads``. What orjson refuses and
    ``json`` may take (``NaN``, escaped lone surrogates) goes to the encoder, and so does a body
    with a run of 19 digits or more (orjson reads an integer beyond 64 bits as a float, where
    ``json`` keeps it exact): the result is ``json.loads``'s, value for value (a test holds it to
    that)."""
    encoder = get_encoder()
    if type(encoder) is JSONEncoder and not _has_long_digit_run(body):
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            pass
    return encoder.decode(body)


def decode(body: bytes, queue_name: str | None) -> Message[Any] | Malformed:
    """The message in ``body``, consumed from ``queue_name`` (None: any queue), or what makes it
    malformed."""
    try:
        data = loads(body)
    except Exception:  # not UTF-8, not JSON, nested too deep, a number too long...
        return Malformed("body", "could not be decoded (not UTF-8 JSON)")
    problem = problem_of(data, queue_name)
    if problem is not None:
        return _salvaged(data, problem)
    return _message(data)


def _message(data: dict[str, Any]) -> Message[Any]:
    """A checked body as a ``Message``: its fields set as the frozen dataclass's ``__init__`` sets
    them (``args`` a tuple, as its ``__post_init__`` makes it), without the seven
    ``object.__setattr__`` calls (1.6-2.1 -> 0.3 us on the consumer's thread)."""
    message: Message[Any] = object.__new__(Message)
    fields = message.__dict__
    fields.update(data)
    fields["args"] = tuple(data["args"])
    return message


def int_option(options: Any, name: str, default: int = 0) -> int:
    """Option ``name`` as an integer, or ``default`` when it is absent or not an integer: for
    code that must not fail on a message it did not check (building a dead letter's record)."""
    value = options.get(name) if isinstance(options, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else default
