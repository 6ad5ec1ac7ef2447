"""The dashboard's state store features, one contract run against both backends (real Redis, a real
SQLite file): the job index, timelines and per-minute counts, the dead-letter index, heartbeats,
the audit log and reading a bucket without taking."""

from __future__ import annotations

import time

import pytest

from jobsystem.rabbitmq.dead_letter_indexer import DeadLetterIndexer
from jobsystem.store.audit import audit_backend
from jobsystem.store.buckets import TakeRequest, bucket_backend
from jobsystem.store.dead_letter_index import DeadLetterEntry, DeadLetterFilter, dead_letter_index
from jobsystem.store.heartbeats import KEEP_MS, heartbeat_backend
from jobsystem.store.job_index import JobFilter
from jobsystem.store.redis import RedisStore
from jobsystem.store.status import status_backend
from jobsystem.store.status_records import StatusUpdate, order_of
from middleware import dead_letters as record

# ``store``: each backend in turn (tests/unit/conftest.py).


def update(
    message_id: str, state: str, attempt: int, at: float, queue: str = "q1", actor: str = "a1"
) -> StatusUpdate:
    once = {"actor": actor, "queue": queue, "enqueued_at": str(at)}
    return StatusUpdate(
        message_id, queue, order_of(attempt, state), {"state": state, "updated_at": str(at)}, once
    )


def test_the_job_index_pages_filters_and_moves_jobs_between_states(store):
    backend = status_backend(store)
    now = int(time.time() * 1000)
    backend.apply(
        [update(f"m{i:02d}", "queued", 0, now + i, actor="a1" if i % 2 else "a2") for i in range(10)], 60_000
    )
    backend.apply([update("m03", "running", 1, now + 20), update("m03", "succeeded", 1, now + 30)], 60_000)
    first, cursor = backend.page(JobFilter(), None, 4)
    second, _ = backend.page(JobFilter(), cursor, 4)
    assert [r.message_id for r in first + second] == [f"m{i:02d}" for i in range(9, 1, -1)]
    assert [r.message_id for r in backend.page(JobFilter(state="succeeded"))[0]] == ["m03"]
    assert backend.total(JobFilter(state="queued")) == (9, True)
    assert [r.message_id for r in backend.page(JobFilter(queue="q1", actor="a1", state="queued"))[0]] == [
        "m09",
        "m07",
        "m05",
        "m01",
    ]
    assert backend.page(JobFilter(queue="other"))[0] == []
    record = backend.get("m03")
    assert record is not None
    assert [step[0] for step in record.timeline] == ["queued", "running", "succeeded"]
    minutes = backend.minutes(["q1"], now - 3_600_000)["q1"]
    assert sum(m.get("queued", 0) for m in minutes.values()) == 10
    assert sum(m.get("succeeded", 0) for m in minutes.values()) == 1


def test_a_state_written_late_still_takes_its_place_in_the_timeline(store):
    backend = status_backend(store)
    now = int(time.time() * 1000)
    backend.apply([update("m", "running", 1, now + 5)], 60_000)
    backend.apply([update("m", "queued", 0, now + 6)], 60_000)  # the sender's write, after the worker's
    backend.apply([update("m", "queued", 0, now + 7)], 60_000)  # once only
    record = backend.get("m")
    assert record is not None
    assert record.state == "running" and [s[0] for s in record.timeline] == ["queued", "running"]


def test_the_dead_letter_index_counts_copies_filters_and_trims(store):
    backend = dead_letter_index(store)
    now = int(time.time() * 1000)
    entries = [
        DeadLetterEntry(
            "q1" if i % 2 else "q2",
            f"m{i}",
            "a1" if i % 3 else "a2",
            "retries_exhausted",
            "E1" if i % 4 else "E2",
            "err",
            "tb",
            3,
            now,
            now + i,
        )
        for i in range(20)
    ]
    backend.add([*entries, entries[19]], ttl_ms=None, max_length=8)
    assert backend.counts() == {"q1": 9, "q2": 8}  # 10 each, capped at 8 entries (one has 2 copies)
    assert backend.facets() == {"actor": ["a1", "a2"], "exception": ["E1", "E2"]}
    page = backend.page(DeadLetterFilter(), None, 3)
    following = backend.page(DeadLetterFilter(), page.next, 3)
    assert [e.message_id for e in page.entries + following.entries] == [
        "m19",
        "m18",
        "m17",
        "m16",
        "m15",
        "m14",
    ]
    matching = backend.page(DeadLetterFilter(queue="q1", actor="a1"), None, 50).entries
    assert [e.message_id for e in matching] == ["m19", "m17", "m13", "m11", "m7", "m5"]
    since = backend.page(DeadLetterFilter(exception="E2", since=now + 10), None, 50).entries
    assert [e.message_id for e in since] == ["m16", "m12"]
    entry = backend.get("q1", "m19")
    assert entry is not None and entry.copies == 2
    backend.remove([("q1", "m19"), ("q1", "m17")])
    entry = backend.get("q1", "m19")
    assert entry is not None and entry.copies == 1 and backend.get("q1", "m17") is None
    backend.replace("q1", [entries[1]])
    assert backend.counts() == {"q1": 1, "q2": 8}


def test_a_confirmed_dead_letter_is_indexed_in_the_background_from_its_record(store):
    indexer = DeadLetterIndexer(store)
    indexer.record(
        "q1",
        "m1",
        {
            record.HEADER_REASON: "retries_exhausted",
            record.HEADER_EXCEPTION: b"KeyError",  # as pika hands back a header
            record.HEADER_ERROR: "x" * 5_000,
            record.HEADER_ACTOR: "a1",
            record.HEADER_ATTEMPTS: 3,
            record.HEADER_FAILED_AT: "2026-11-29T08:00:00+00:00",
        },
    )
    indexer.record("q1", "m2", {record.HEADER_ATTEMPTS: True, record.HEADER_FAILED_AT: "yesterday"})
    assert indexer.flush(10)
    first = indexer.backend.get("q1", "m1")
    assert first is not None
    assert (first.exception, first.actor, first.attempts) == ("KeyError", "a1", 3)
    assert first.failed_at == 1_795_939_200_000 and len(first.error) == 1_000
    second = indexer.backend.get("q1", "m2")  # a record of the wrong shape: indexed, fields empty
    assert second is not None
    assert (second.reason, second.attempts, second.failed_at) == ("rejected", 0, 0)


def test_heartbeats_audit_and_bucket_levels(store):
    now = int(time.time() * 1000)
    beats = heartbeat_backend(store)
    beats.beat("h:1", {"host": "h", "pid": 1, "busy": 2}, now - 20_000)
    beats.beat("h:2", {"host": "h", "pid": 2, "busy": 0}, now)
    assert [(w["pid"], w["last_beat"]) for w in beats.workers(now)] == [(2, now), (1, now - 20_000)]
    assert beats.workers(now + 3_600_000 - 10_000) == [{"host": "h", "pid": 2, "busy": 0, "last_beat": now}]

    audit = audit_backend(store)
    first = audit.start({"user": "admin", "action": "a"}, now)
    audit.start({"user": "admin", "action": "b"}, now + 1)
    audit.finish(first, {"state": "done", "count": 3})
    entries, _ = audit.page(None, 10)
    assert [(e["action"], e["state"], e.get("count")) for e in entries] == [
        ("b", "started", None),
        ("a", "done", 3),
    ]

    buckets = bucket_backend(store)
    assert buckets.peek("svc", 10.0, 20.0).tokens == 20.0  # never used: full
    for _ in range(25):
        buckets.take(TakeRequest("svc", 10.0, 20.0, 1, 60_000))
    level = buckets.peek("svc", 10.0, 20.0)
    assert level.tokens < 0 and 4.0 <= level.reserved <= 5.0  # five slots reserved ahead, refilling
    assert level.deferred == 0  # those callers were not deferred (no owner): nothing on record
    buckets.take(TakeRequest("svc", 10.0, 20.0, 1, 60_000, owner="m1"))  # a deferral, recorded
    assert buckets.peek("svc", 10.0, 20.0).deferred == 1


def test_a_prefixs_heartbeats_expire_once_no_worker_beats(store):
    """A worker killed (no ``stopped_at``) with no other beating after it left its records for good."""
    if not isinstance(store, RedisStore):
        pytest.skip("SQLite keeps its rows in the project's own file")
    heartbeat_backend(store).beat("h:1", {"host": "h", "pid": 1}, int(time.time() * 1000))
    for key in ("workers", "workers:beats"):
        assert 0 < store.client.pttl(store.key(key)) <= KEEP_MS


def test_a_cursor_from_a_request_that_is_not_one_reads_the_first_page(store):
    """A page's cursor comes from the request: one whose time does not fit SQLite's integers, or
    whose digits are not ASCII, is no cursor (it raised OverflowError or ValueError, a 500)."""
    from jobsystem.store.sorted_index import Cursor

    backend = status_backend(store)
    backend.apply([update(f"m{i}", "queued", 0, 1_000 + i) for i in range(3)], 60_000)
    first, _ = backend.page(JobFilter(), None, 10)
    for text in ("99999999999999999999.1", "1.\u00b2", "\u00b9.1", "x.y"):
        cursor = Cursor.decode(text)
        assert [r.message_id for r in backend.page(JobFilter(), cursor, 10)[0]] in (
            [r.message_id for r in first],
            [],
        )


def test_a_job_not_yet_finished_may_be_cancelled_a_scheduled_one_too(store):
    # A job sent with a delay (or deferred) far ahead is ``scheduled``: cancelling it is what the
    # cancellation marks that outlive its due time are for, so the page offers it.
    from types import SimpleNamespace

    from dashboard.jobs import job_detail
    from jobsystem.privacy.scrub import Scrubber

    backend = status_backend(store)
    now = int(time.time() * 1000)
    states = ["queued", "scheduled", "running", "failed", "retrying", "succeeded", "dead", "cancelled"]
    backend.apply([update(f"m-{state}", state, 1, now) for state in states], 60_000)
    system = SimpleNamespace(scrubber=Scrubber())
    project = SimpleNamespace(status=backend, dead_letter_index=None, system=system)
    cancellable = [s for s in states if job_detail(project, f"m-{s}")["can_cancel"]]  # type: ignore[arg-type, index]
    assert cancellable == ["queued", "scheduled", "running", "failed", "retrying"]
