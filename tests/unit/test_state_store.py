"""One contract, run unchanged against both state store backends (real Redis, a real SQLite file)."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest
import redis
from redis._parsers.base import BaseParser

from jobsystem.store import open_store
from jobsystem.store.base import Backends, StateStore, StoreMisconfigured, StoreUnavailable
from jobsystem.store.idempotency import idempotency_backend
from jobsystem.store.redis import RedisStore
from jobsystem.store.sqlite import SqliteStore
from tests.support import TEST_REDIS_URL, fresh_store, wait_for


def test_open_store_picks_the_backend(tmp_path):
    assert isinstance(open_store("redis://127.0.0.1:6379/15"), RedisStore)
    assert isinstance(open_store(f"sqlite:///{tmp_path}/x.db"), SqliteStore)
    with pytest.raises(ValueError):
        open_store("postgres://db/x")


def test_each_store_picks_its_own_backend_of_a_feature(tmp_path):
    backends = Backends(redis=lambda store: ("redis", store), sqlite=lambda store: ("sqlite", store))
    redis_store = open_store("redis://127.0.0.1:6379/15")
    sqlite_store = open_store(f"sqlite:///{tmp_path}/x.db")
    assert redis_store.operations(backends) == ("redis", redis_store)
    assert sqlite_store.operations(backends) == ("sqlite", sqlite_store)


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (sqlite3.OperationalError("database is locked"), StoreUnavailable),
        (sqlite3.DatabaseError("file is not a database"), StoreMisconfigured),
    ],
)
def test_a_sqlite_error_becomes_a_store_error(tmp_path, raised, expected):
    with pytest.raises(StoreUnavailable) as caught, SqliteStore(tmp_path / "x.db").errors():
        raise raised
    assert type(caught.value) is expected


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (redis.ConnectionError("Connection reset"), StoreUnavailable),
        ("OOM command not allowed when used memory > 'maxmemory'.", StoreUnavailable),
        ("NOAUTH Authentication required.", StoreMisconfigured),
        ("ERR DB index is out of range", StoreMisconfigured),
        # redis-py strips the NOPERM from the text: the class says it, and a worker stops at start.
        ("NOPERM this user has no permissions to run the 'evalsha' command", StoreMisconfigured),
    ],
)
def test_a_redis_error_becomes_a_store_error(reply, expected):
    if not isinstance(reply, redis.RedisError):
        reply = BaseParser.parse_error(reply)  # type: ignore[no-untyped-call]
    with pytest.raises(StoreUnavailable) as caught, RedisStore("redis://127.0.0.1:6379/15").errors():
        raise reply
    assert type(caught.value) is expected


def test_a_failed_sqlite_read_is_a_store_error(tmp_path):
    store = SqliteStore(tmp_path / "x.db")
    assert store.rows("SELECT 1 + ?", (1,)) == [(2,)]
    with pytest.raises(StoreUnavailable, match="no such table"):
        store.rows("SELECT * FROM missing")


def test_values_expire(store: StateStore):
    store.set("a", "1")
    store.set("b", b"2", ttl_ms=150)
    assert store.get("a") == b"1" and store.get("b") == b"2"
    wait_for(lambda: store.get("b") is None, timeout=2, what="b's TTL")
    assert store.get("a") == b"1"
    store.delete("a", "missing")
    assert store.get("a") is None


def test_clock_is_milliseconds_near_now(store: StateStore):
    assert abs(store.now_ms() - time.time() * 1000) < 5_000


def test_lease_is_exclusive_renewable_and_expires(store: StateStore):
    assert store.acquire_lease("leader", "a", 300)
    assert not store.acquire_lease("leader", "b", 300)
    renewed = time.monotonic()
    assert store.acquire_lease("leader", "a", 300)  # renewal by the holder
    assert store.lease_holder("leader") == "a"
    assert not store.release_lease("leader", "b")
    wait_for(lambda: store.lease_holder("leader") is None, timeout=2, what="the lease's TTL")
    assert time.monotonic() - renewed >= 0.3  # the renewal's TTL ran in full
    assert store.acquire_lease("leader", "b", 300)
    assert store.release_lease("leader", "b")
    assert store.acquire_lease("leader", "a", 300)


def test_batch_applies_writes_together(store: StateStore):
    with store.batch() as view:
        for i in range(50):
            view.set(f"k{i}", str(i), ttl_ms=60_000)
    assert [store.get(f"k{i}") for i in (0, 49)] == [b"0", b"49"]


# -- idempotency keys ----------------------------------------------------------------------------


def test_register_reports_the_first_message(store: StateStore):
    keys = idempotency_backend(store)
    assert keys.register("send:k", "m1", 60_000) is None
    assert keys.register("send:k", "m2", 60_000) == "m1"
    assert keys.register_many([("send:k", "m3", 60_000), ("send:j", "m4", 60_000)]) == ["m1", None]


def test_claim_lifecycle(store: StateStore):
    keys = idempotency_backend(store)
    first = keys.claim("a:k", "m1", "owner-1", 10_000, 60_000)
    assert first.status == "claimed" and first.message_id == "m1"
    held = keys.claim("a:k", "m1", "owner-2", 10_000, 60_000)
    assert held.status == "held" and 0 < held.wait_ms <= 10_000
    keys.release_many([("a:k", "owner-1")])
    assert keys.claim("a:k", "m1", "owner-2", 10_000, 60_000).status == "claimed"
    keys.complete_many([("a:k", '{"total": 3}', 60_000)])
    done = keys.claim("a:k", "m9", "owner-3", 10_000, 60_000)
    assert done.status == "completed" and done.result == '{"total": 3}' and done.message_id == "m1"
    record = keys.lookup("a:k")
    assert record is not None and record.state == "done" and record.result == '{"total": 3}'
    assert keys.lookup("a:unknown") is None


def test_a_lapsed_lease_can_be_taken_over_and_renewal_keeps_it(store: StateStore):
    keys = idempotency_backend(store)
    assert keys.claim("a:lapse", "m", "dead", 200, 60_000).status == "claimed"
    assert keys.claim("a:keep", "m", "alive", 200, 60_000).status == "claimed"
    for _ in range(4):
        time.sleep(0.1)
        keys.renew([("a:keep", "alive")], 200)
    assert keys.claim("a:lapse", "m", "next", 200, 60_000).status == "claimed"
    assert keys.claim("a:keep", "m", "next", 200, 60_000).status == "held"


def test_completed_keys_expire_after_their_ttl(store: StateStore):
    keys = idempotency_backend(store)
    keys.claim("a:ttl", "m", "o", 1_000, 60_000)
    keys.complete_many([("a:ttl", None, 200), ("a:other", "1", 60_000)])
    assert keys.claim("a:ttl", "m", "p", 1_000, 60_000).status == "completed"
    # Until its TTL is over, a claim is answered "completed" (and changes nothing); then granted.
    wait_for(lambda: keys.claim("a:ttl", "m2", "p", 1_000, 60_000).status == "claimed", timeout=2)


def test_a_key_whose_record_went_while_its_job_ran_is_remembered_done(store: StateStore):
    """The record can expire (a job longer than the key's TTL) or be deleted while the job runs:
    its completion still records it, so a later duplicate is skipped, not run a second time."""
    keys = idempotency_backend(store)
    keys.complete_many([("a:gone", '"ok"', 60_000)])
    record = keys.lookup("a:gone")
    assert record is not None and (record.state, record.result) == ("done", '"ok"')
    assert keys.claim("a:gone", "m2", "p", 1_000, 60_000).status == "completed"


def test_one_claim_wins_among_racing_threads(store: StateStore):
    keys = idempotency_backend(store)
    results: list[str] = []
    barrier = threading.Barrier(16)

    def race(i: int) -> None:
        barrier.wait()
        results.append(keys.claim("a:race", "m", f"owner-{i}", 10_000, 60_000).status)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["claimed"] + ["held"] * 15


def test_an_unreachable_redis_is_store_unavailable():
    store = RedisStore("redis://127.0.0.1:1/0", socket_timeout=0.5)
    with pytest.raises(StoreUnavailable):
        store.ping()
    with pytest.raises(StoreUnavailable):
        idempotency_backend(store).claim("a:k", "m", "o", 1_000, 1_000)


def test_a_script_call_interrupted_before_its_reply_leaves_no_reply_for_the_next_call(tmp_path):
    """A worker thread can be interrupted mid-call (a time limit, a cancellation raised in it):
    the reply then still waits on the thread's connection, and the next call would read it as its
    own (a lease answered "acquired" for someone else's question)."""

    class Interrupted(BaseException):
        pass

    with fresh_store("redis", tmp_path) as store:
        assert isinstance(store, RedisStore)
        conn = store.raw_connection()
        read_response = conn.read_response

        def interrupted(*args: object, **kwargs: object) -> object:
            conn.read_response = read_response
            raise Interrupted

        assert store.acquire_lease("held", "someone", 60_000)
        conn.read_response = interrupted
        with pytest.raises(Interrupted):
            store.acquire_lease("free", "me", 60_000)  # its reply (1: acquired) is left unread
        assert store.acquire_lease("held", "me", 60_000) is False


def test_a_fresh_redis_store_is_deleted_also_when_the_body_raises(tmp_path):
    """Test hygiene: a test failing inside ``with fresh_store(...)`` leaves no key in the test Redis."""
    with pytest.raises(RuntimeError), fresh_store("redis", tmp_path) as store:
        store.set("x", b"1")
        key = store.key("x")
        raise RuntimeError("the test failed")
    assert redis.Redis.from_url(TEST_REDIS_URL).exists(key) == 0
