"""Token leases in a worker process: the lease pool on its own, and the RateLimits middleware
spending from leases on each state store backend (hooks called as the worker calls them)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from dramatiq.middleware import SkipMessage

from jobsystem.runtime.token_leases import TokenLeases
from jobsystem.settings import SettingsError, load_settings
from jobsystem.store import StateStore
from jobsystem.store.base import StoreUnavailable
from jobsystem.store.buckets import TakeRequest
from middleware.ratelimit import RateLimited
from tests.unit.stub import delivery
from tests.unit.test_ratelimit import Setup

# -- the pool --------------------------------------------------------------------------------------


def test_leased_tokens_are_spent_until_gone_or_ended_then_dropped():
    leases = TokenLeases()
    assert not leases.spend("a", 1, now=0)
    leases.add("a", 3, end=10)
    assert [leases.spend("a", 1, now=1) for _ in range(4)] == [True, True, True, False]
    leases.add("a", 3, end=10)
    assert leases.spend("a", 2, now=5)
    assert not leases.spend("a", 2, now=5)  # 1 left: too little for a job of 2, dropped
    leases.add("a", 5, end=10)
    assert not leases.spend("a", 1, now=10)  # ended: dropped unspent
    assert (leases.tally.leased, leases.tally.spent, leases.tally.dropped) == (11, 5, 6)


def test_a_later_lease_is_spent_after_the_one_ending_first():
    leases = TokenLeases()
    leases.add("a", 1, end=2)
    leases.add("a", 2, end=5)
    assert leases.spend("a", 1, now=1) and leases.held("a") == 2
    assert leases.spend("a", 1, now=3) and leases.spend("a", 1, now=4) and not leases.spend("a", 1, now=4)
    leases.add("a", 1, end=8)
    leases.add("a", 1, end=7)  # ends before the last: merged into it, which now ends at 7
    assert not leases.spend("a", 1, now=7) and leases.tally.dropped == 2


def test_the_pool_holds_leases_for_a_bounded_number_of_buckets():
    leases = TokenLeases(max_buckets=2)
    for name in ("t1", "t2", "t3"):
        leases.add(name, 4, end=10)
    assert leases.held("t1") == 0 and leases.held("t2") == leases.held("t3") == 4
    assert leases.spend("t2", 1, now=0)  # t2 is now the most recently used: t3 goes next
    leases.add("t4", 4, end=10)
    assert leases.held("t3") == 0 and leases.held("t2") == 3
    leases.drop()
    assert leases.held("t2") == leases.held("t4") == 0 and leases.tally.dropped == 4 + 4 + 3 + 4


# -- the middleware --------------------------------------------------------------------------------


class Hot(Setup):
    """A bucket ``api`` far from empty (leases of 20 tokens), an actor spending from it, and a
    record of every batch of takes sent to the store."""

    def __init__(self, store: StateStore, rate: float = 1_000, burst: float = 320, **options: Any) -> None:
        super().__init__(store, rate, burst, **options)
        self.sent: list[list[TakeRequest]] = []
        send = self.middleware.takes.call_many

        def counted(requests: list[TakeRequest]) -> Any:
            self.sent.append(requests)
            return send(requests)

        self.middleware.takes.call_many = counted

    def run(self, bucket: str = "api", **options: Any) -> Any:
        return self.before(self.actor.message(bucket).copy(options=options))


@pytest.fixture
def hot(store: StateStore) -> Iterator[Hot]:
    setup = Hot(store)
    yield setup
    setup.broker.close()


def test_a_hot_bucket_runs_a_leases_worth_of_jobs_per_store_call(hot):
    hot.run()
    ((first,),) = hot.sent
    assert first.lease == 20  # min(32 jobs, 320 / 16, 1000/s x 50 ms)
    for _ in range(20):
        hot.run()
    assert len(hot.sent) == 1  # all 20 from the lease
    hot.run()
    assert len(hot.sent) == 2 and hot.middleware.leases.tally.spent == 20


def test_a_paced_bucket_is_never_leased(store):
    paced = Hot(store, rate=100, burst=10)  # a lease would be under one job: take one at a time
    for _ in range(5):
        paced.run()
    assert len(paced.sent) == 5 and {r.lease for batch in paced.sent for r in batch} == {0}
    assert paced.middleware.leases.tally.leased == 0
    paced.broker.close()


def test_a_store_error_while_leasing_defers_the_job_as_a_failed_take_does(hot):
    def down(requests: list[TakeRequest]) -> Any:
        hot.sent.append(requests)
        raise StoreUnavailable("connection refused")

    hot.middleware.takes.call_many = down
    message = hot.actor.message().copy(options={"retries": 1})
    with pytest.raises(SkipMessage):
        hot.middleware.before_process_message(hot.broker, delivery(message))
    ((copy, delay),) = hot.broker.enqueued
    assert copy.message_id == message.message_id and copy.options["retries"] == 1
    assert delay is not None and delay >= 2_000 and hot.sent[0][0].lease == 20
    assert hot.middleware.leases.held("api") == 0


def test_an_upstream_429_drops_the_leases_of_its_bucket(hot):
    proxy = hot.run()
    assert hot.middleware.leases.held("api") == 20
    try:
        raise RateLimited(retry_after=5)
    except RateLimited:
        hot.middleware.after_skip_message(hot.broker, proxy)
    assert hot.middleware.leases.held("api") == 0
    with pytest.raises(SkipMessage):  # the next job asks the drained bucket, not a lease
        hot.run()


def test_a_message_back_for_its_slot_does_not_spend_from_a_lease(hot):
    hot.run()
    slot = {"bucket": "api", "at": 1}  # a slot long passed: the message takes afresh
    hot.run(rate_limit_slot=slot)
    assert len(hot.sent) == 2 and hot.sent[1][0].slot_ms == slot["at"] and hot.sent[1][0].lease == 0
    assert hot.middleware.leases.held("api") == 20


def test_per_key_buckets_keep_leases_for_a_bounded_number_of_keys(store):
    tenants = Hot(store, lease_buckets=2)
    for tenant in ("t1", "t2", "t3"):
        tenants.run(f"api:{tenant}")
    held = [tenants.middleware.leases.held(r.key) for batch in tenants.sent for r in batch]
    assert held == [0, 20, 20] and tenants.middleware.leases.tally.dropped == 20
    tenants.broker.close()


def test_leased_tokens_unspent_at_the_end_of_the_lease_are_dropped(store):
    # Long enough that the second job starts within it on a loaded CI machine (100 ms did not).
    short = Hot(store, lease_ms=500)
    short.run()
    short.run()
    assert short.sent[0][0].lease_ms == 500 and len(short.sent) == 1  # the second ran on the lease
    time.sleep(0.55)  # the lease ended 500 ms after the store granted it
    short.run()
    assert len(short.sent) == 2 and short.middleware.leases.tally.dropped == 19
    short.broker.close()


def test_leases_are_sized_by_a_setting_that_can_turn_them_off(store):
    assert load_settings({}).rate_limit_lease_jobs == 32
    off = load_settings({"RATE_LIMIT_LEASE_JOBS": "0"}).rate_limit_lease_jobs
    with pytest.raises(SettingsError, match="RATE_LIMIT_LEASE_JOBS"):
        load_settings({"RATE_LIMIT_LEASE_JOBS": "-1"})
    unleased = Hot(store, lease_jobs=off)
    for _ in range(3):
        unleased.run()
    assert len(unleased.sent) == 3 and unleased.middleware.leases.tally.leased == 0
    unleased.broker.close()
