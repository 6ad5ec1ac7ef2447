"""Property: every body published to a queue a real worker consumes ends in exactly one of
"ran once" or "dead-lettered once (reason ``malformed``)", never both, never neither.

Hypothesis generates lists of bodies, well-formed messages mixed with malformed ones: a field
replaced by a JSON value of the wrong shape, a field missing or unexpected, an option a middleware
reads given a wrong type, JSON that is not an object, bytes that are not JSON. Which bodies are
malformed is decided here from the message format itself, not by asking the code under test. One
worker serves every example; each body carries its own id (its AMQP ``message_id`` and, when it
runs, the token the ``flaky`` actor records).
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobsystem.system import get_system
from tests import workload
from tests.support import wait_for

FIELDS = ("queue_name", "actor_name", "args", "kwargs", "options", "message_id", "message_timestamp")
#: Options some middleware reads as non-negative integers.
COUNTERS = (
    "retries",
    "max_retries",
    "attempts",
    "replays",
    "idempotency_store_waits",
    "rate_limit_store_waits",
)

leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**15),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
json_values = st.recursive(
    leaves,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def well_formed(field: str, value: Any, queue: str) -> bool:
    """The message format, field by field (Dramatiq's ``Message``)."""
    checks: dict[str, Callable[[Any], bool]] = {
        "queue_name": lambda v: v == queue,
        "actor_name": lambda v: isinstance(v, str) and v != "",
        "args": lambda v: isinstance(v, list),
        "kwargs": lambda v: isinstance(v, dict),
        "options": lambda v: isinstance(v, dict),
        "message_id": lambda v: isinstance(v, str) and v != "",
        "message_timestamp": _is_int,
    }
    return checks[field](value)


valid_options = st.fixed_dictionaries(
    {},
    optional={
        "retries": st.integers(0, 3),
        "max_retries": st.integers(0, 5),
        "attempts": st.integers(0, 3),
        "replays": st.integers(0, 2),
        "broker_priority": st.integers(0, 10),
        "eta": st.integers(0, 10**12),  # in the past: due at once
        "application_note": json_values,  # options the project does not read pass as they are
    },
)
mutations = st.one_of(
    # A field replaced by a value of the wrong shape (a right-shaped one could be arguments the
    # actor does not take: a failure of the job, not a malformed message).
    st.tuples(st.just("field"), st.sampled_from(FIELDS), json_values).filter(
        lambda spec: not well_formed(spec[1], spec[2], queue="")
    ),
    st.tuples(st.just("missing"), st.sampled_from(FIELDS)),
    st.tuples(st.just("unexpected"), st.sampled_from(["priority", "id", "body"]), json_values),
    st.tuples(st.just("counter"), st.sampled_from(COUNTERS), json_values),
    st.tuples(st.just("eta"), json_values.filter(lambda v: not (_is_int(v) or isinstance(v, float)))),
    st.tuples(st.just("not_an_object"), json_values.filter(lambda v: not isinstance(v, dict))),
    st.tuples(st.just("bytes"), st.binary(max_size=40)),
)
#: About half well-formed messages, half malformed ones.
valid_specs = st.tuples(st.just("valid"), valid_options, st.booleans())
specs = st.booleans().flatmap(lambda valid: valid_specs if valid else mutations)


def render(spec: tuple[Any, ...], queue: str, ident: str) -> tuple[bytes, bool]:
    """The body of ``spec`` for message ``ident``, and whether it is a well-formed message."""
    kind = spec[0]
    body: dict[str, Any] = {
        "queue_name": queue,
        "actor_name": "flaky",
        "args": [ident, 0],
        "kwargs": {},
        "options": {},
        "message_id": ident,
        "message_timestamp": int(time.time() * 1000),
    }
    if kind == "valid":
        _, options, by_keyword = spec
        body.update(options=options, **({"args": [ident], "kwargs": {"failures": 0}} if by_keyword else {}))
        return json.dumps(body).encode(), True
    if kind == "bytes":
        return spec[1], False
    if kind == "not_an_object":
        return json.dumps(spec[1]).encode(), False
    if kind == "field":
        body[spec[1]] = spec[2]
        return json.dumps(body).encode(), well_formed(spec[1], spec[2], queue)
    if kind == "missing":
        del body[spec[1]]
    elif kind == "unexpected":
        body[spec[1]] = spec[2]
    elif kind == "counter":
        body["options"] = {spec[1]: spec[2]}
        return json.dumps(body).encode(), spec[2] is None or (_is_int(spec[2]) and spec[2] >= 0)
    elif kind == "eta":
        body["options"] = {"eta": spec[1]}
        return json.dumps(body).encode(), spec[1] is None
    return json.dumps(body).encode(), False


def outcomes(queues, store, prefix: str, published: dict[str, bool]) -> dict[str, tuple[int, int, set[str]]]:
    """Per body id: how often the actor ran, how many dead letters it has, and their reasons."""
    letters = [
        m
        for m in queues.peek(queues.name(workload.flaky) + ".DLQ", count=5000)
        if m["properties"]["message_id"] in published
    ]
    dead = Counter(m["properties"]["message_id"] for m in letters)
    reasons: dict[str, set[str]] = {}
    for m in letters:
        reasons.setdefault(m["properties"]["message_id"], set()).add(
            m["properties"]["headers"]["x-dl-reason"]
        )
    return {
        ident: (int(store.llen(f"test:{prefix}attempt:{ident}")), dead[ident], reasons.get(ident, set()))
        for ident in published
    }


def expected(valid: bool) -> tuple[int, int, set[str]]:
    return (1, 0, set()) if valid else (0, 1, {"malformed"})


@pytest.fixture
def every_body(start_worker, queues, store, prefix) -> Iterator[dict[str, bool]]:
    """One worker for every example, on queues that exist before anything is sent; yields the
    record of every body published (id: well formed?), checked once more after the last example,
    so that a second run or dead letter of an early body would not go unseen."""
    queues.broker.declare_queue(queues.name(workload.flaky), ensure=True)
    start_worker(threads=4, JOB_MAX_RETRIES="0")
    published: dict[str, bool] = {}
    yield published
    assert published and all(
        outcome == expected(published[ident])
        for ident, outcome in outcomes(queues, store, prefix, published).items()
    )


@settings(
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(bodies=st.lists(specs, min_size=1, max_size=20))
def test_every_generated_body_runs_once_or_is_dead_lettered_once(every_body, queues, store, prefix, bodies):
    queue = queues.name(workload.flaky)
    run = uuid.uuid4().hex[:8]
    published = {}
    for i, spec in enumerate(bodies):
        ident = f"{run}-{i}"
        body, valid = render(spec, queue, ident)
        published[ident] = valid
        get_system().broker.channel.basic_publish(
            "", queue, body, pika.BasicProperties(delivery_mode=2, message_id=ident)
        )
    every_body.update(published)

    wait_for(
        lambda: all(ran + dead for ran, dead, _ in outcomes(queues, store, prefix, published).values()),
        timeout=60,
        interval=0.1,
        what="an outcome for every body",
    )
    for ident, outcome in outcomes(queues, store, prefix, published).items():
        assert outcome == expected(published[ident]), (ident, bodies[int(ident.split("-")[1])])
