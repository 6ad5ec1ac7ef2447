"""How long the Redis job index keeps an entry: as long as its record, however long ago its job was
sent; entries the previous release filed (scored by send time, unknown to ``jobs:until``) are
still trimmed, once sent longer ago than any entry's life (``jobs:reach``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from jobsystem.store.redis import RedisStore, reply_text
from jobsystem.store.status import StatusBackend, status_backend
from jobsystem.store.status_records import StatusUpdate, order_of
from tests.support import fresh_store

TTL_MS = 60_000
SETS = ("all", "q:q", "a:bill", "s:{state}", "qs:q|{state}", "as:bill|{state}")


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisStore]:
    with fresh_store("redis", tmp_path) as store:
        assert isinstance(store, RedisStore)
        yield store


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """The status writer's clock (``clock.now``, ms), moved by the test."""
    moved = SimpleNamespace(now=int(time.time() * 1000))
    monkeypatch.setattr("jobsystem.store.status.time", SimpleNamespace(time=lambda: moved.now / 1000))
    return moved


def write(backend: StatusBackend, message_id: str, state: str, sent: int, at: int, **fields: str) -> None:
    """One change of ``message_id`` (a job of ``bill`` on ``q`` sent at ``sent``) as Status makes it."""
    once = {"actor": "bill", "queue": "q", "enqueued_at": str(sent)}
    values = {"state": state, "updated_at": str(at), **fields}
    backend.apply([StatusUpdate(message_id, "q", order_of(1, state), values, once)], TTL_MS)


def filed_in(store: RedisStore, message_id: str) -> list[str]:
    """The sets of the job index (and ``until``) that hold ``message_id``."""
    found = []
    for raw in store.client.scan_iter(f"{store.namespace}jobs:*", count=1_000):
        name = reply_text(raw)
        if reply_text(store.client.type(raw)) != "zset":
            continue
        members = [reply_text(m) for m in store.client.zrange(raw, 0, -1)]
        short = name[len(store.namespace) + len("jobs:") :]
        if message_id in members or any(m.endswith("|" + message_id) for m in members):
            found.append(short)
    return sorted(found)


def every_set(state: str) -> list[str]:
    return sorted([name.format(state=state) for name in SETS] + ["until"])


def test_an_entry_leaves_every_set_when_its_record_expires(redis: RedisStore, clock: SimpleNamespace) -> None:
    """Taken out of its state's sets too (it moved there after its first filing), by a later write
    of another job, while the other job's entry stays."""
    backend = status_backend(redis)
    start = clock.now
    write(backend, "m-1", "queued", start, start)
    clock.now += 1_000
    write(backend, "m-1", "succeeded", start, clock.now)
    assert filed_in(redis, "m-1") == every_set("succeeded")
    clock.now += TTL_MS + 1_000  # m-1's record has expired
    write(backend, "m-2", "queued", clock.now, clock.now)
    assert {m: filed_in(redis, m) for m in ("m-1", "m-2")} == {"m-1": [], "m-2": every_set("queued")}


def test_a_job_run_long_after_it_was_sent_stays_listed_for_its_records_life(
    redis: RedisStore, clock: SimpleNamespace
) -> None:
    """Sent ten TTLs ago, due now: its entry lives a TTL after its last change, and sets written
    meanwhile (each write trims the previous release's entries) keep it."""
    backend = status_backend(redis)
    sent = clock.now - 10 * TTL_MS
    write(backend, "m-late", "scheduled", sent, sent, due_at=str(clock.now))
    write(backend, "m-late", "succeeded", sent, clock.now)
    clock.now += TTL_MS // 2
    write(backend, "m-other", "succeeded", clock.now, clock.now)
    assert filed_in(redis, "m-late") == every_set("succeeded")
    assert int(reply_text(redis.client.get(f"{redis.namespace}jobs:reach"))) >= 10 * TTL_MS
    assert redis.client.pttl(f"{redis.namespace}jobs:all") > 10 * TTL_MS  # not expired whole before it
    clock.now += TTL_MS
    write(backend, "m-other", "dead", clock.now, clock.now)
    assert filed_in(redis, "m-late") == []


def test_an_entry_of_the_previous_release_is_trimmed_by_its_send_time(
    redis: RedisStore, clock: SimpleNamespace
) -> None:
    """Filed by send time and unknown to ``jobs:until``: a set written trims it once it was sent
    longer ago than the longest life of an entry (the TTL here)."""
    backend = status_backend(redis)
    old = clock.now - TTL_MS - 1_000
    for name in ("all", "q:q", "s:succeeded"):
        redis.client.zadd(f"{redis.namespace}jobs:{name}", {"m-old": old})
    write(backend, "m-new", "succeeded", clock.now, clock.now)
    assert {m: filed_in(redis, m) for m in ("m-old", "m-new")} == {
        "m-old": [],
        "m-new": every_set("succeeded"),
    }


def test_a_call_takes_out_a_bounded_number_of_expired_entries_the_next_the_rest(
    redis: RedisStore, clock: SimpleNamespace
) -> None:
    """At most 2,000 a call (a burst of expiries never stalls Redis in one call), the oldest first,
    and exactly those: ``jobs:until`` keeps the others, the next call takes them out."""
    backend = status_backend(redis)
    start, jobs = clock.now, 2_100
    updates = [
        StatusUpdate(
            f"m-{n:05}",
            "q",
            order_of(1, "queued"),
            {"state": "queued", "updated_at": str(start)},
            {"actor": "bill", "queue": "q", "enqueued_at": str(start)},
        )
        for n in range(jobs)
    ]
    backend.apply(updates, TTL_MS)
    clock.now += TTL_MS + 1_000
    # the next calls write no set of queued jobs: their send-time trim cannot take them out
    queued_key, until_key = f"{redis.namespace}jobs:s:queued", f"{redis.namespace}jobs:until"
    write(backend, "m-next-1", "succeeded", clock.now, clock.now)
    assert redis.client.zcard(queued_key) == jobs - 2_000
    assert redis.client.zcard(until_key) == jobs - 2_000 + 1
    write(backend, "m-next-2", "succeeded", clock.now, clock.now)
    assert redis.client.zcard(queued_key) == 0
    assert sorted(reply_text(m) for m in redis.client.zrange(until_key, 0, -1)) == [
        "succeeded|q|bill|m-next-1",
        "succeeded|q|bill|m-next-2",
    ]
