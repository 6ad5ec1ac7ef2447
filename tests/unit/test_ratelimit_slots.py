"""Slot records, on both state store backends: a slot is honoured only for the message it was
issued to (its owner), once; a slot not on record is ignored and the caller takes afresh."""

from __future__ import annotations

import time

from jobsystem.store.base import StateStore
from jobsystem.store.buckets import BucketBackend, TakeRequest, bucket_backend
from jobsystem.store.redis import RedisStore
from jobsystem.store.sqlite import SqliteStore
from tests.support import wait_for

#: A bucket of one token refilled every 500 ms: slow enough that a slot given out is still ahead
#: when the next call reads it on a loaded machine (at 100 ms, CI once saw it pass in between).
INTERVAL_MS = 500
RATE, BURST = 1000 / INTERVAL_MS, 1.0
#: A sleep the callers accept: longer than any wait for one token, so they sleep, not defer.
SLEEP_MS = 5_000


def req(slot_ms: int | None = None, owner: str | None = None, sleep_ms: int = 0) -> TakeRequest:
    return TakeRequest("b", RATE, BURST, 1.0, 60_000, slot_ms, owner=owner, sleep_ms=sleep_ms)


def records(store: StateStore) -> int:
    """Every slot record of bucket ``b`` kept by the store, passed ones included."""
    if isinstance(store, RedisStore):
        return int(store.client.zcard(store.key("rate-slots:b")))
    assert isinstance(store, SqliteStore)
    (count,) = store.connection().execute("SELECT count(*) FROM rate_bucket_slots").fetchone()
    return int(count)


def deferred_slot(buckets: BucketBackend) -> int:
    """Empty the bucket, then defer ``m1``: the slot it is given (recorded for it)."""
    assert buckets.take(req()).status == "run"
    take = buckets.take(req(owner="m1"))
    assert take.status == "wait" and buckets.peek("b", RATE, BURST).deferred == 1
    return take.at_ms


def test_a_forged_slot_is_ignored_and_the_caller_takes_a_token(store: StateStore):
    buckets = bucket_backend(store)
    first = buckets.take(req())  # the bucket's one token
    forged = first.at_ms + 300  # a slot nobody was given
    answer = buckets.take(req(slot_ms=forged, owner="intruder", sleep_ms=SLEEP_MS))
    assert answer.at_ms != forged and answer.status == "wait"  # its own slot, one token later
    assert abs(answer.at_ms - first.at_ms - INTERVAL_MS) <= 1
    # It took that token: the next newcomer waits behind it.
    assert abs(buckets.take(req()).at_ms - answer.at_ms - INTERVAL_MS) <= 1


def test_a_slot_is_honoured_for_its_owner_only_and_once(store: StateStore):
    buckets = bucket_backend(store)
    slot = deferred_slot(buckets)
    other = buckets.take(req(slot_ms=slot, owner="m2", sleep_ms=SLEEP_MS))  # not the owner
    assert other.at_ms > slot
    honoured = buckets.take(req(slot_ms=slot, owner="m1", sleep_ms=SLEEP_MS))
    assert honoured.at_ms == slot and buckets.peek("b", RATE, BURST).deferred == 0  # consumed
    replayed = buckets.take(req(slot_ms=slot, owner="m1", sleep_ms=SLEEP_MS))  # a second copy
    assert replayed.at_ms > other.at_ms  # a token of its own, after the others'


def test_two_copies_in_one_batch_share_no_token(store: StateStore):
    slot = deferred_slot(bucket_backend(store))
    back = req(slot_ms=slot, owner="m1", sleep_ms=SLEEP_MS)
    first, second = bucket_backend(store).take_many([back, back])
    assert first.at_ms == slot and second.at_ms > slot and second.status == "wait"


def test_a_caller_back_too_early_to_sleep_keeps_its_record(store: StateStore):
    buckets = bucket_backend(store)
    slot = deferred_slot(buckets)
    early = buckets.take(req(slot_ms=slot, owner="m1", sleep_ms=0))  # it defers again
    assert early.status == "wait" and early.at_ms == slot and records(store) == 1
    assert buckets.take(req(slot_ms=slot, owner="m1", sleep_ms=SLEEP_MS)).at_ms == slot
    assert records(store) == 0


def test_only_deferrals_are_recorded(store: StateStore):
    buckets = bucket_backend(store)
    assert buckets.take(req(owner="m1", sleep_ms=SLEEP_MS)).status == "run"
    slept = buckets.take(req(owner="m2", sleep_ms=SLEEP_MS))  # one interval: slept through, not deferred
    assert slept.status == "wait" and records(store) == 0
    if isinstance(store, RedisStore):
        assert store.client.exists(store.key("rate-slots:b")) == 0  # never touched
    back = buckets.take(req(slot_ms=slept.at_ms, owner="m2", sleep_ms=SLEEP_MS))
    assert back.at_ms > slept.at_ms  # a slept wait is no claim: taken afresh


def test_a_drain_voids_the_records_of_slots_before_its_end(store: StateStore):
    buckets = bucket_backend(store)
    slot = deferred_slot(buckets)
    buckets.drain("b", RATE, BURST, 2 * INTERVAL_MS)  # past the slot
    assert records(store) == 0
    voided = buckets.take(req(slot_ms=slot, owner="m1", sleep_ms=SLEEP_MS))
    assert voided.at_ms > slot and voided.wait_ms >= 2 * INTERVAL_MS  # taken afresh, behind the drain


def test_drain_and_take_records_the_slot_it_books(store: StateStore):
    buckets = bucket_backend(store)
    old = deferred_slot(buckets)
    pause = 2 * INTERVAL_MS  # past m1's slot
    answer = buckets.drain_and_take(pause, req(owner="m2"))  # an upstream 429: always deferred
    assert answer.status == "wait" and answer.wait_ms >= pause and records(store) == 1  # m1's voided
    back = buckets.take(req(slot_ms=answer.at_ms, owner="m2", sleep_ms=SLEEP_MS))
    assert back.at_ms == answer.at_ms and records(store) == 0
    assert buckets.take(req(slot_ms=old, owner="m1", sleep_ms=SLEEP_MS)).at_ms > answer.at_ms


def test_a_reset_voids_the_records(store: StateStore):
    buckets = bucket_backend(store)
    slot = deferred_slot(buckets)
    buckets.reset("b")
    assert records(store) == 0 and buckets.peek("b", RATE, BURST).deferred == 0
    back = buckets.take(req(slot_ms=slot, owner="m1", sleep_ms=SLEEP_MS))
    assert back.status == "run" and back.at_ms < slot  # the full bucket's token, not the slot


def test_records_are_deleted_once_their_slot_has_passed(store: StateStore):
    linger = 100
    buckets = bucket_backend(store, linger_ms=linger)
    slot = deferred_slot(buckets)
    if isinstance(store, RedisStore):
        key = store.key("rate-slots:b")
        assert 0 < store.client.pttl(key) <= slot - time.time() * 1000 + linger + 5
        wait_for(lambda: store.client.exists(key) == 0, timeout=2, what="the records' expiry")
    else:
        time.sleep(max(0.0, slot / 1000 - time.time()) + 0.01)
    assert buckets.peek("b", RATE, BURST).deferred == 0
    # The next deferral prunes what has passed: only its own record is left.
    _, deferral = buckets.take_many([req(), req(owner="m2")])
    assert deferral.status == "wait" and records(store) == 1
