"""The delay cascade's arithmetic (levels, routing keys, bindings) and the scheduled state: a job
delayed past the horizon is recorded ``scheduled`` with its due time and filed in its queue's
scheduled index until it leaves the cascade or runs, on each state store backend."""

from __future__ import annotations

import re
import time
from typing import Any

import dramatiq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobsystem.rabbitmq.delays import (
    EXIT_LEAD_MS,
    LEVELS,
    MAX_DELAY_MS,
    DelayCascade,
    bits_of,
    cascade_seconds,
    destination_binding,
    level_binding,
    routing_key,
    seconds_of,
    skip_binding,
)
from jobsystem.runtime.message_shape import ETA_REACH_MS
from jobsystem.settings import MAX_DURATION_MS
from middleware.status import Status
from tests.support import wait_for
from tests.unit.stub import RecordingBroker, delivery

QUEUE_NAMES = st.from_regex(r"[a-z][a-z0-9_.-]{0,40}\.DQ", fullmatch=True)


def topic_matches(pattern: str, key: str) -> bool:
    """RabbitMQ's topic matching: ``*`` one word, ``#`` zero or more."""
    words, parts = key.split("."), pattern.split(".")

    def match(i: int, j: int) -> bool:
        if j == len(parts):
            return i == len(words)
        if parts[j] == "#":
            return any(match(k, j + 1) for k in range(i, len(words) + 1))
        return i < len(words) and parts[j] in ("*", words[i]) and match(i + 1, j + 1)

    return match(0, 0)


def travel(
    cascade: DelayCascade, key: str, bound: list[str], start: str | None = None
) -> tuple[int, list[str]]:
    """Follow a message published to ``start`` (default: where the broker publishes it) through
    the cascade as RabbitMQ routes it: the seconds it waits, and the queues of ``bound`` the
    deliver exchange hands it to."""
    waited, exchange = 0, start or cascade.exchange_for(seconds_of(key))
    while exchange != cascade.deliver:
        level = int(exchange.rsplit("L", 1)[1])
        into_queue = topic_matches(level_binding(level), key)
        passes_on = topic_matches(skip_binding(level), key)
        assert into_queue != passes_on  # exactly one route at every level
        if into_queue:
            arguments = cascade.queue_arguments(level)
            waited += arguments["x-message-ttl"] // 1000
            exchange = arguments["x-dead-letter-exchange"]
        else:
            exchange = cascade.level(level - 1) if level else cascade.deliver
    return waited, [queue for queue in bound if topic_matches(destination_binding(queue), key)]


@given(seconds=st.integers(0, 2**LEVELS - 1), destination=QUEUE_NAMES)
def test_a_message_waits_exactly_its_seconds_and_reaches_only_its_queue(seconds, destination):
    cascade = DelayCascade("env.")
    key = routing_key(seconds, destination)
    assert seconds_of(key) == seconds and key.endswith("." + destination)
    # Another queue whose name ends like this one's, or starts like it, never receives it.
    others = ["other." + destination, destination.removesuffix(".DQ") + ".x.DQ", "a.b"]
    assert travel(cascade, key, [destination, *others]) == (seconds, [destination])
    assert travel(cascade, key, [destination], start=cascade.entry) == (seconds, [destination])


@given(seconds=st.integers(0, 2**LEVELS - 1))
def test_the_bits_are_most_significant_first(seconds):
    bits = bits_of(seconds)
    assert len(bits) == LEVELS and int("".join(map(str, bits)), 2) == seconds


@given(delay_ms=st.integers(2_000, MAX_DELAY_MS))
def test_a_message_leaves_the_cascade_one_to_two_seconds_before_it_is_due(delay_ms):
    waited_ms = cascade_seconds(delay_ms) * 1000
    assert EXIT_LEAD_MS <= delay_ms - waited_ms < EXIT_LEAD_MS + 1000


def test_the_cascade_covers_every_duration_a_setting_holds_and_refuses_longer():
    assert MAX_DELAY_MS >= MAX_DURATION_MS
    assert cascade_seconds(MAX_DURATION_MS) < 2**LEVELS
    with pytest.raises(ValueError, match="at most"):
        cascade_seconds(MAX_DELAY_MS + 1)
    with pytest.raises(ValueError):
        bits_of(2**LEVELS)


def test_a_float_delay_waits_as_its_whole_milliseconds_would():
    # send_with_options(delay=timedelta(...).total_seconds() * 1000) passes a float.
    assert cascade_seconds(45_000.0) == cascade_seconds(45_000) == 44
    assert routing_key(cascade_seconds(45_000.5), "q.DQ") == routing_key(44, "q.DQ")
    assert DelayCascade().exchange_for(cascade_seconds(45_000.0)) == DelayCascade().level(5)


def test_the_message_check_refuses_no_eta_the_cascade_can_hold():
    assert ETA_REACH_MS == MAX_DELAY_MS


def test_levels_have_power_of_two_ttls_within_rabbitmqs_limit_and_names_carry_the_prefix():
    cascade = DelayCascade("staging.")
    ttls = [cascade.queue_arguments(level)["x-message-ttl"] for level in range(LEVELS)]
    assert ttls == [2**level * 1000 for level in range(LEVELS)]
    assert max(ttls) < MAX_DURATION_MS  # RabbitMQ refuses a TTL past ten years
    assert cascade.queue_arguments(0)["x-dead-letter-exchange"] == "staging.delay.deliver"
    assert cascade.queue_arguments(5)["x-dead-letter-exchange"] == "staging.delay.L4"
    names = [*cascade.queues(), cascade.entry, cascade.deliver, cascade.unroutable]
    assert all(name.startswith("staging.delay.") for name in names)
    assert cascade.entry == f"staging.delay.L{LEVELS - 1}"


def test_a_routing_key_too_long_for_rabbitmq_is_refused():
    with pytest.raises(ValueError, match="too long"):
        routing_key(5, "q" * 200 + ".DQ")
    assert re.fullmatch(r"([01]\.){29}q\.DQ", routing_key(5, "q.DQ"))


# -- the scheduled state ----------------------------------------------------------------------------


@pytest.fixture
def tracked(store):
    status = Status(store, scheduled_after_ms=30_000)
    broker = RecordingBroker(middleware=[status])
    actor = dramatiq.actor(broker=broker, actor_name="job", queue_name="q")(lambda: None)
    yield status, broker, actor
    status.writes.stop()


def delayed(message: dramatiq.Message[Any], delay_ms: int, **options: Any) -> dramatiq.Message[Any]:
    """The copy the broker publishes for ``delay_ms`` (queue ``q.DQ``, ``eta``)."""
    eta = int(time.time() * 1000) + delay_ms
    return message.copy(queue_name="q.DQ", options={"eta": eta, **options})


def test_a_send_past_the_horizon_is_scheduled_until_it_leaves_the_cascade(tracked):
    status, broker, actor = tracked
    hour, month = actor.message(), actor.message()
    for message, delay in ((hour, 3_600_000), (month, 30 * 86_400_000)):
        status.after_enqueue(broker, delayed(message, delay), delay)
    short = actor.message()
    status.after_enqueue(broker, delayed(short, 5_000), 5_000)  # held by a worker: queued
    assert status.flush(10)
    record = status.get(hour.message_id)
    assert record is not None and record.state == "scheduled"
    assert abs(record.due_at - (time.time() * 1000 + 3_600_000)) < 5_000
    assert status.get(short.message_id).state == "queued"
    (found,) = status.backend.scheduled(["q"]).values()
    assert (found.count, found.next_due_at) == (2, record.due_at)
    # The sender's own ``queued`` landing late, and the worker's when the job leaves the cascade
    # (moved from q.DQ to q), do not hide it: it is scheduled until it runs.
    status.after_enqueue(broker, hour.copy(), None)
    assert status.flush(10)
    assert status.get(hour.message_id).state == "scheduled"
    status.before_process_message(broker, delivery(hour))
    assert status.flush(10)
    assert status.get(hour.message_id).state == "running"
    left = status.backend.scheduled(["q", "elsewhere"])
    assert (left["q"].count, left["q"].next_due_at) == (1, status.get(month.message_id).due_at)
    assert (left["elsewhere"].count, left["elsewhere"].next_due_at) == (0, None)


def test_the_count_due_soon_costs_redis_a_command_only_when_asked(tracked, monkeypatch):
    status, broker, actor = tracked
    if not hasattr(status.backend.store, "client"):
        pytest.skip("a Redis store's round trip")
    soon, later = actor.message(), actor.message()
    status.after_enqueue(broker, delayed(soon, 3_600_000), 3_600_000)
    status.after_enqueue(broker, delayed(later, 30 * 86_400_000), 30 * 86_400_000)
    assert status.flush(10)
    sent: list[str] = []
    pipeline = type(status.backend.store.client.pipeline())
    execute = pipeline.execute

    def recording(self: Any, *args: Any, **kwargs: Any) -> Any:
        sent.extend(str(command[0][0]) for command in self.command_stack)
        return execute(self, *args, **kwargs)

    monkeypatch.setattr(pipeline, "execute", recording)
    plain = status.backend.scheduled(["q", "elsewhere"])
    assert "ZCOUNT" not in sent
    assert (plain["q"].count, plain["q"].soon, plain["elsewhere"].count) == (2, 0, 0)
    asked = status.backend.scheduled(["q", "elsewhere"], 2 * 3_600_000)
    assert sent.count("ZCOUNT") == 2
    assert (asked["q"].count, asked["q"].soon, asked["elsewhere"].soon) == (2, 1, 0)


def test_a_long_backoff_is_scheduled_in_the_place_of_retrying_and_leaves_the_index_when_it_runs(tracked):
    status, broker, actor = tracked
    message = actor.message()
    status.after_enqueue(broker, message, None)
    first = delivery(message)
    status.before_process_message(broker, first)
    status.after_process_message(broker, first, exception=RuntimeError("down"))
    retry = delayed(message, 2 * 3_600_000, retries=1)
    status.after_enqueue(broker, retry, 2 * 3_600_000)  # Retries' backoff of two hours
    assert status.flush(10)
    record = status.get(message.message_id)
    assert (record.state, record.retry_at, record.due_at) == (
        "scheduled",
        retry.options["eta"],
        retry.options["eta"],
    )
    assert status.backend.scheduled(["q"])["q"].count == 1
    status.before_process_message(broker, delivery(retry.copy(queue_name="q")))
    assert status.flush(10)
    running = status.get(message.message_id)
    assert (running.state, running.attempts, running.due_at) == ("running", 2, None)
    assert status.backend.scheduled(["q"])["q"].count == 0


def test_a_scheduled_record_outlives_the_status_ttl_until_it_is_due(store):
    status = Status(store, ttl_ms=200, scheduled_after_ms=30_000)
    broker = RecordingBroker(middleware=[status])
    actor = dramatiq.actor(broker=broker, actor_name="job", queue_name="q")(lambda: None)
    try:
        later, now = actor.message(), actor.message()
        status.after_enqueue(broker, delayed(later, 60_000), 60_000)
        status.after_enqueue(broker, now, None)
        assert status.flush(10)
        # ``later`` was written first: with the TTL of a record not scheduled it would be gone
        # no later than ``now``, so once ``now`` has expired, ``later`` must still be there.
        wait_for(lambda: status.get(now.message_id) is None, timeout=2, what="the record's TTL")
        record = status.get(later.message_id)
        assert record is not None and record.state == "scheduled"
    finally:
        status.writes.stop()


def test_migration_leaves_the_cascades_queues_alone():
    from jobsystem.ops.migration import QueueState, work_queues
    from jobsystem.settings import load_settings

    names = [*DelayCascade("t1-").queues(), "t1-delay.unroutable", "t1-emails", "t1-emails.DQ", "t1-delays"]
    existing = {name: QueueState(name, {}, 0) for name in names}
    # Even were they named as the project's own (they never are), the cascade's stay out.
    own = set(names)
    assert work_queues(load_settings({"QUEUE_PREFIX": "t1-"}), existing, own) == ["t1-delays", "t1-emails"]


def test_migration_refuses_a_named_queue_of_the_cascade_before_changing_anything():
    from jobsystem.ops.migration import MigrationError, migrate
    from jobsystem.settings import load_settings

    # Rebuilt as a work queue, a level would keep its messages forever: refused before any call
    # to RabbitMQ (this broker object has none to make).
    with pytest.raises(MigrationError, match=r"not a work queue.*'t1-delay\.L3'.*'t1-emails\.DLQ'"):
        names = ["t1-delay.L3", "t1-emails", "t1-emails.DLQ"]
        migrate(object(), load_settings({"QUEUE_PREFIX": "t1-"}), names)  # type: ignore[arg-type]


def test_a_delayed_sends_idempotency_key_stays_pending_until_due_and_its_ttl_after(tracked):
    from jobsystem.runtime.options import key_ttl_ms

    _, broker, actor = tracked
    month = delayed(actor.message(), 30 * 86_400_000)
    ttl = key_ttl_ms(broker, month, 86_400_000)
    assert 31 * 86_400_000 - 5_000 <= ttl <= 31 * 86_400_000
    assert key_ttl_ms(broker, actor.message(), 86_400_000) == 86_400_000
