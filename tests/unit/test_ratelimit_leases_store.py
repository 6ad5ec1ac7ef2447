"""Token leases in the state store (see ``jobsystem.store.buckets``), run unchanged against both
backends (real Redis, a real SQLite file): when a lease is granted, and that the tokens left in the
bucket plus those out on lease never exceed the burst."""

from __future__ import annotations

import time

from jobsystem.store.base import StateStore
from jobsystem.store.buckets import TakeRequest, bucket_backend

#: A refill slow enough to leave a peek's tokens within 0.1 of the take's even when a loaded machine
#: stalls the test for seconds (at 1 token/s, a 190 ms stall under CI's load failed the bound).
SLOW = 0.01


def leasing(
    lease: float = 10.0,
    *,
    rate: float = 1_000.0,
    burst: float = 100.0,
    cost: float = 1.0,
    lease_ms: int = 1_000,
    slot_ms: int | None = None,
    key: str = "h",
) -> TakeRequest:
    return TakeRequest(key, rate, burst, cost, 60_000, slot_ms, lease, lease_ms)


def test_a_bucket_far_from_empty_grants_the_lease_with_the_take(store: StateStore):
    buckets = bucket_backend(store)
    answer = buckets.take(leasing(10, rate=SLOW))
    assert answer.status == "run" and answer.leased == 10
    assert 900 <= answer.lease_left_ms <= 1_000
    level = buckets.peek("h", SLOW, 100)
    assert 89 <= level.tokens < 89.1  # the take's token and the lease left the bucket at once
    # A later lease in the same period ends with it: every lease of a period ends together.
    second = buckets.take(leasing(10, rate=SLOW))
    assert second.leased == 10 and second.lease_left_ms <= answer.lease_left_ms


def test_no_lease_unless_the_bucket_holds_twice_the_lease_after_the_take(store: StateStore):
    buckets = bucket_backend(store)
    for key in ("at", "below"):
        buckets.take_many([leasing(0, rate=SLOW, key=key) for _ in range(79 if key == "at" else 80)])
    at = buckets.take(leasing(10, rate=SLOW, key="at"))  # 20 left after the take: 2 x 10
    assert at.status == "run" and at.leased == 10
    below = buckets.take(leasing(10, rate=SLOW, key="below"))  # 19 left after the take
    assert below.status == "run" and below.leased == 0
    assert 19 <= buckets.peek("below", SLOW, 100).tokens < 19.1  # the take itself went through


def test_the_tokens_out_on_lease_in_a_period_stay_within_a_quarter_of_the_burst(store: StateStore):
    buckets = bucket_backend(store)
    answers = buckets.take_many([leasing(6, rate=1, burst=40) for _ in range(2)])
    assert [a.leased for a in answers] == [6, 0]  # 12 would pass 40 / 4
    assert buckets.take(leasing(4, rate=1, burst=40)).leased == 4  # 10: just within


def test_a_waiting_take_a_slot_or_a_drained_bucket_gets_no_lease(store: StateStore):
    buckets = bucket_backend(store)
    assert buckets.take(leasing(1, rate=1, burst=100, cost=100)).leased == 0  # nothing left
    waiting = buckets.take(leasing(1, rate=1, burst=100))
    assert waiting.status == "wait" and waiting.leased == 0
    full = leasing(1, rate=1_000, burst=100, key="s")
    slot = buckets.take(leasing(1, rate=1_000, burst=100, key="s", slot_ms=int(time.time() * 1000) + 5_000))
    assert slot.leased == 0  # a slot a deferred message brings back is honoured, never leased on
    buckets.drain("d", 1_000, 100, 300)
    assert buckets.take(leasing(1, rate=1_000, burst=100, key="d")).leased == 0
    assert buckets.take(full).leased == 1


def test_the_tokens_out_on_lease_are_kept_out_of_the_refill_until_the_period_ends(store: StateStore):
    buckets = bucket_backend(store)
    rate, burst = 200.0, 100.0
    # A period of 1 s: the peek below falls within it even when a loaded machine stalls this
    # thread for most of a second.
    answers = buckets.take_many([leasing(12, rate=rate, burst=burst, lease_ms=1000) for _ in range(3)])
    assert [a.leased for a in answers] == [12, 12, 0]  # 36 would pass burst / 4
    time.sleep(0.3)  # enough to refill 60 tokens: the bucket would be full without leases
    level = buckets.peek("h", rate, burst)
    assert level.tokens <= burst - 24  # bucket + leases <= burst, while the leases may be spent
    assert level.tokens >= burst - 24 - 0.01
    time.sleep(0.9)  # the period is over, and 0.2 s more refill 24+ tokens: the bucket is full
    assert buckets.peek("h", rate, burst).tokens == burst
    assert buckets.take(leasing(12, rate=rate, burst=burst, lease_ms=600)).leased == 12  # a new period


def test_a_bucket_that_is_always_hot_keeps_bucket_plus_leases_within_the_burst(store: StateStore):
    """Takes with leases, each followed by a peek, until leases were granted in several periods
    and the bound was checked with leases out several times (no fixed window: a loaded machine
    only takes longer). A lease's end is read on the store's clock (the take's ``at_ms`` plus
    ``lease_left_ms``, to 1 ms), which is this host's wall clock (Redis's ``TIME``, SQLite's
    ``time.time``); a peek is compared with the leases certainly still out when it answered,
    those ending after the clock read once it returned. A stall between a take and the peek then
    leaves an ended lease out of the sum, never in it (an ended lease counted against a refilled
    bucket failed the bound under load). A product that let leased tokens back into the bucket
    before their period ended fails the bound (at 2,000 tokens/s the bucket is full again within
    20 ms); one that never started a new period runs out of time."""
    buckets = bucket_backend(store)
    rate, burst, lease_ms = 2_000.0, 40.0, 200
    leases: list[tuple[float, float]] = []  # (tokens, earliest end on the store's clock, ms)
    periods: list[float] = []  # the end of each lease period that granted leases
    checked = 0  # peeks compared while leases were certainly out
    give_up = time.monotonic() + 60
    while len(periods) < 4 or checked < 10:
        assert time.monotonic() < give_up, (periods, checked)
        answers = buckets.take_many([leasing(2, rate=rate, burst=burst, lease_ms=lease_ms) for _ in range(3)])
        for answer in (a for a in answers if a.leased):
            end = answer.at_ms + answer.lease_left_ms - 1
            leases.append((answer.leased, end))
            if not periods or end > periods[-1] + 2:  # a period's leases all end with it
                periods.append(end)
        before = time.time() * 1000
        level = buckets.peek("h", rate, burst)
        after = time.time() * 1000
        if after < before:  # the wall clock stepped back: "after" may precede the peek
            continue
        out = sum(tokens for tokens, end in leases if end > after)
        assert out <= burst / 4
        assert level.tokens + out <= burst + 1e-6
        checked += out > 0
        time.sleep(0.01)
