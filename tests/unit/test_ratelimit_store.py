"""The token bucket contract, run unchanged against both state store backends (real Redis, a real
SQLite file), with the ``store`` fixture of the state store's own contract tests."""

from __future__ import annotations

import threading
import time

import pytest

from jobsystem.store.base import StateStore, StoreUnavailable
from jobsystem.store.buckets import LINGER_MS, TakeRequest, bucket_backend
from jobsystem.store.redis import RedisStore
from jobsystem.store.sqlite import SqliteStore
from tests.support import wait_for


def req(
    key: str = "b",
    rate: float = 10.0,
    burst: float = 3.0,
    cost: float = 1.0,
    horizon_ms: int = 60_000,
    slot_ms: int | None = None,
    owner: str | None = None,
    sleep_ms: int = 0,
) -> TakeRequest:
    return TakeRequest(key, rate, burst, cost, horizon_ms, slot_ms, owner=owner, sleep_ms=sleep_ms)


def test_a_full_bucket_runs_burst_jobs_then_hands_out_evenly_spaced_slots(store: StateStore):
    buckets = bucket_backend(store)
    answers = buckets.take_many([req() for _ in range(6)])  # one atomic batch: one clock reading
    assert [a.status for a in answers] == ["run"] * 3 + ["wait"] * 3
    assert [a.wait_ms for a in answers] == [0, 0, 0, 100, 200, 300]
    assert [a.at_ms - answers[0].at_ms for a in answers] == [0, 0, 0, 100, 200, 300]
    later = buckets.take(req())  # a separate call: its slot follows the last one handed out
    assert later.status == "wait" and abs(later.at_ms - answers[-1].at_ms - 100) <= 1  # ms rounding


def test_slots_beyond_the_horizon_are_refused_without_taking(store: StateStore):
    buckets = bucket_backend(store)
    slow = req(rate=2, burst=1, horizon_ms=1_200)  # a slot every 500 ms, none more than 1.2 s ahead
    first = buckets.take_many([slow] * 3)
    assert [a.status for a in first] == ["run", "wait", "wait"]
    refused = buckets.take_many([slow] * 3)
    assert [a.status for a in refused] == ["refused"] * 3
    # Nothing was taken: each is told the same time, when the next slot comes within the horizon.
    assert {a.wait_ms for a in refused} == {refused[0].wait_ms} and 0 < refused[0].wait_ms <= 300
    time.sleep(refused[0].wait_ms / 1000 + 0.02)
    again = buckets.take(slow)
    assert again.status == "wait" and abs(again.at_ms - first[2].at_ms - 500) <= 1


def test_refill_follows_the_store_clock_up_to_the_burst(store: StateStore):
    buckets = bucket_backend(store)
    assert [a.status for a in buckets.take_many([req(rate=20, burst=2) for _ in range(2)])] == ["run"] * 2
    time.sleep(0.3)  # 6 tokens' worth of time, but the bucket holds 2
    answers = buckets.take_many([req(rate=20, burst=2) for _ in range(3)])
    assert [a.status for a in answers] == ["run", "run", "wait"]
    assert 0 < answers[2].wait_ms <= 50


def test_a_slot_brought_back_in_time_is_honoured_without_taking_again(store: StateStore):
    buckets = bucket_backend(store)
    buckets.take_many([req(burst=1) for _ in range(1)])
    slot = buckets.take(req(burst=1, owner="m1"))  # a deferral: recorded for m1
    assert slot.status == "wait"
    back = buckets.take(req(burst=1, slot_ms=slot.at_ms, owner="m1", sleep_ms=1_000))
    assert back.status == "wait" and back.at_ms == slot.at_ms and 0 < back.wait_ms <= slot.wait_ms + 1
    # No token was taken for it a second time: the next newcomer's slot is right after it.
    assert abs(buckets.take(req(burst=1)).at_ms - slot.at_ms - 100) <= 1


def test_a_slot_that_has_passed_is_void_and_the_caller_takes_afresh(store: StateStore):
    buckets = bucket_backend(store)
    run = buckets.take(req(burst=1))
    late = buckets.take(req(burst=1, slot_ms=run.at_ms - 10, owner="m1"))
    assert late.status == "wait" and late.at_ms > run.at_ms  # a new slot, not the passed one


def test_cost_takes_that_many_tokens(store: StateStore):
    buckets = bucket_backend(store)
    answers = buckets.take_many([req(burst=5, cost=2), req(burst=5, cost=2), req(burst=5, cost=2)])
    assert [a.status for a in answers] == ["run", "run", "wait"]
    assert answers[2].wait_ms == 100  # 1 token left, 1 more to wait for at 10/s


def test_buckets_are_independent(store: StateStore):
    buckets = bucket_backend(store)
    answers = buckets.take_many([req("smtp:a", burst=1), req("smtp:b", burst=1), req("smtp:a", burst=1)])
    assert [a.status for a in answers] == ["run", "run", "wait"]


def test_drain_empties_the_bucket_for_a_while_and_voids_earlier_slots(store: StateStore):
    buckets = bucket_backend(store)
    buckets.take(req(burst=1))
    slot = buckets.take(req(burst=1))
    assert slot.status == "wait"
    buckets.drain("b", 10.0, 1.0, 500)
    after = buckets.take(req(burst=1))
    assert after.status == "wait" and after.wait_ms >= 500
    voided = buckets.take(req(burst=1, slot_ms=slot.at_ms))
    assert voided.at_ms > after.at_ms  # taken afresh, behind the drain
    # Draining never gives tokens back: a shorter drain of an emptier bucket changes nothing.
    buckets.drain("b", 10.0, 1.0, 1)
    assert buckets.take(req(burst=1)).at_ms > voided.at_ms


def test_drain_and_take_is_a_drain_then_a_take_in_one_operation(store: StateStore):
    buckets = bucket_backend(store)
    assert buckets.take(req(burst=1)).status == "run"
    slot = buckets.take(req(burst=1))
    answer = buckets.drain_and_take(500, req(burst=1))
    assert answer.status == "wait" and answer.wait_ms >= 500  # behind the drain, not refilled
    assert answer.at_ms > slot.at_ms
    # The drained bucket is what later takes see: the next slot comes after this one.
    assert buckets.take(req(burst=1)).at_ms > answer.at_ms
    assert buckets.take(req(burst=1, slot_ms=slot.at_ms)).at_ms > answer.at_ms  # the old slot is void


def test_reset_forgets_the_bucket(store: StateStore):
    buckets = bucket_backend(store)
    buckets.take_many([req(burst=1) for _ in range(5)])
    buckets.reset("b")
    assert buckets.take(req(burst=1)).status == "run"


def test_a_bucket_back_to_full_leaves_no_state_behind(store: StateStore):
    assert bucket_backend(store).linger_ms == LINGER_MS == 1_000  # in production
    linger = 100  # shortened: the test need not wait a second
    buckets = bucket_backend(store, linger_ms=linger)
    buckets.take(req(rate=100, burst=1))
    if isinstance(store, RedisStore):
        key = store.key("rate:b")
        assert 0 < store.client.pttl(key) <= 10 + linger  # full again in 10 ms, then a linger
        wait_for(lambda: store.client.exists(key) == 0, timeout=2, what="the bucket's expiry")
    else:
        assert isinstance(store, SqliteStore)
        (ttl,) = store.connection().execute("SELECT expires_at - ts FROM rate_buckets").fetchone()
        assert 0 < ttl <= 10 + linger
        time.sleep((10 + linger) / 1000)
    assert buckets.take(req(rate=100, burst=1)).status == "run"


def conforms(slots: list[int], rate: float, burst: float) -> bool:
    """No window [slots[i], slots[j]] holds more than burst + rate * length starts (slots are
    rounded up to whole milliseconds: 1 ms of tolerance)."""
    slots = sorted(slots)
    return all(
        j - i + 1 <= burst + rate * (slots[j] - slots[i] + 1) / 1000
        for i in range(len(slots))
        for j in range(i, len(slots))
    )


def test_racing_threads_get_distinct_slots_that_keep_to_the_rate(store: StateStore):
    buckets = bucket_backend(store)
    barrier = threading.Barrier(12)
    answers = []

    def race() -> None:
        barrier.wait()
        for _ in range(5):
            answers.append(buckets.take(req(rate=50, burst=4)))

    threads = [threading.Thread(target=race) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    slots = [a.at_ms for a in answers]
    assert len(answers) == 60 and sum(a.status == "run" for a in answers) >= 4
    assert conforms(slots, rate=50, burst=4)


def test_an_unreachable_redis_is_store_unavailable():
    buckets = bucket_backend(RedisStore("redis://127.0.0.1:1/0", socket_timeout=0.5))
    with pytest.raises(StoreUnavailable):
        buckets.take(req())
