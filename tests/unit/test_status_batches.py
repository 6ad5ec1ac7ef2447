"""A batch of status updates ends exactly as the same updates applied one at a time.

The status writers fold several changes of one message into one write (its final fields, its
final place in the job index); this checks everything readable afterwards, on both backends:
records with their timelines, counters, per-minute counts, the scheduled index and the job index.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobsystem.store import StateStore
from jobsystem.store.job_index import JobFilter
from jobsystem.store.redis import RedisStore, reply_text
from jobsystem.store.sqlite import SqliteStore
from jobsystem.store.status import status_backend
from jobsystem.store.status_history import TIMELINE_MAX, add_to_timeline
from jobsystem.store.status_records import StatusUpdate, encode_updates, order_of
from tests.support import fresh_store

# ``store``: each backend in turn (tests/unit/conftest.py); ``twin``: another of the same kind.

TTL_MS = 3_600_000
RUN = ("attempts", "started_at")


@pytest.fixture
def twin(store: StateStore, tmp_path: Path) -> Iterator[StateStore]:
    with fresh_store(store.kind, tmp_path / "twin") as other:
        yield other


def change(
    message_id: str,
    state: str | None,
    attempt: int,
    at: int,
    *,
    replays: int = 0,
    rank: str | None = None,
    queue: str = "q1",
    **fields: str,
) -> StatusUpdate:
    """An update as :class:`middleware.status.Status` makes it (``state`` None: a progress report)."""
    values = {"updated_at": str(at), **fields}
    # sent at the start of the minute of ``at`` plus the message's number: one time per message
    once = {}
    if state is not None:
        values["state"] = state
        once = {
            "actor": "a" + message_id[-1],
            "queue": queue,
            "enqueued_at": str(at - at % 60_000 + int(message_id[1:])),
        }
    delete = ("progress", "note", "retry_at", "due_at") if state == "running" else ()
    order = order_of(attempt, rank or state or "running", replays)
    return StatusUpdate(message_id, queue, order, values, once, delete)


def mixed(now: int) -> tuple[list[StatusUpdate], list[StatusUpdate]]:
    """What the store held before, and a batch with every kind of change."""
    before = [
        change("m1", "queued", 0, now),
        change("m5", "dead", 1, now + 5, finished_at=str(now + 5)),
        change("m7", "scheduled", 0, now + 7, due_at=str(now + 60_000)),
        change("m8", "running", 1, now + 8, attempts="1", started_at=str(now + 8)),
    ]
    batch = [
        # queued, run, succeeded: all in one batch (a no-op job under load)
        change("m1", "running", 1, now + 10, attempts="1", started_at=str(now + 10)),
        change("m1", "succeeded", 1, now + 11, finished_at=str(now + 11), progress="1"),
        # a failed attempt, retried with a delay (scheduled in retrying's place), run again
        change("m2", "queued", 0, now + 20),
        change("m2", "running", 1, now + 21, attempts="1", started_at=str(now + 21)),
        change("m2", None, 1, now + 22, progress="0.5", note="half"),
        change("m2", "failed", 1, now + 23, error_type="E", error="boom", traceback="tb"),
        change("m2", "scheduled", 1, now + 24, rank="retrying", retry_at="9", due_at=str(now + 90_000)),
        change("m2", "running", 2, now + 25, attempts="2", started_at=str(now + 25)),
        change("m2", "retrying", 2, now + 26, retry_at=str(now + 999)),
        # the worker's running before the sender's queued (late: timeline only)
        change("m3", "running", 1, now + 30, attempts="1", started_at=str(now + 30)),
        change("m3", "queued", 0, now + 31),
        # stays scheduled, in another queue
        change("m4", "scheduled", 0, now + 40, queue="q2", due_at=str(now + 120_000)),
        # a dead job replayed from the dead letters, then a duplicate skipped after it succeeded
        change("m5", "queued", 0, now + 50, replays=1),
        change("m5", "running", 1, now + 51, replays=1, attempts="1", started_at=str(now + 51)),
        change("m5", "succeeded", 1, now + 52, replays=1, finished_at=str(now + 52)),
        change("m5", "skipped", 1, now + 53, finished_at=str(now + 53)),
        # a job that only runs: the index ends under running
        change("m6", "running", 1, now + 60, attempts="1", started_at=str(now + 60)),
        # leaves the cascade, runs and fails for good; its late queued comes after the dead
        change("m7", "running", 1, now + 70, attempts="1", started_at=str(now + 70)),
        change("m7", "dead", 1, now + 71, finished_at=str(now + 71)),
        change("m7", "queued", 0, now + 72),
        # failed and retried at once: the batch leaves it running, filed where it was
        change("m8", "failed", 1, now + 80, error_type="E", error="boom", traceback="tb"),
        change("m8", "retrying", 1, now + 81, retry_at=str(now + 82)),
        change("m8", "running", 2, now + 82, attempts="2", started_at=str(now + 82)),
    ]
    return before, batch


def snapshot(store: StateStore) -> dict[str, Any]:
    """Everything the status writer keeps, by name within the store's namespace."""
    if isinstance(store, RedisStore):
        return _redis_snapshot(store)
    assert isinstance(store, SqliteStore)
    return _sqlite_snapshot(store.connection())


def _redis_snapshot(store: RedisStore) -> dict[str, Any]:
    found: dict[str, Any] = {}
    client = store.client
    for raw in client.scan_iter(f"{store.namespace}*", count=10_000):
        name = reply_text(raw)[len(store.namespace) :]
        kind = reply_text(client.type(raw))
        if kind == "hash":
            found[name] = {reply_text(k): reply_text(v) for k, v in client.hgetall(raw).items()}
        elif kind == "zset":
            scored: list[Any] = client.zrange(raw, 0, -1, withscores=True)  # (member, score) pairs
            # jobs:until scores each entry by its record's expiry: the time of its write, as a TTL
            found[name] = sorted((reply_text(m), None if name == "jobs:until" else s) for m, s in scored)
    return found


def _sqlite_snapshot(conn: sqlite3.Connection) -> dict[str, Any]:
    queries = {
        "records": "SELECT key, ord, fields FROM job_status",
        "counts": "SELECT queue, state, count FROM job_status_counts",
        "minutes": "SELECT queue, minute, state, count FROM job_status_minutes",
        "scheduled": "SELECT queue, message_id, due_at FROM scheduled_jobs",
        "index": "SELECT key, ns, queue, actor, state, enqueued_at FROM job_index",
    }
    found = {name: sorted(conn.execute(sql).fetchall()) for name, sql in queries.items()}
    # A record's fields as a dict: the order its JSON lists them in is not part of it.
    found["records"] = [(k, o, json.loads(f)) for k, o, f in found["records"]]
    return found


def readable(store: StateStore, message_ids: list[str], since: int) -> dict[str, Any]:
    """What the backend's readers return: records, counters, minutes, scheduled, index pages."""
    backend = status_backend(store)
    return {
        "records": {m: r.to_dict() for m, r in backend.get_many(message_ids).items()},
        "counts": backend.counts(["q1", "q2"]),
        "minutes": backend.minutes(["q1", "q2"], since),
        "scheduled": backend.scheduled(["q1", "q2"]),
        "pages": {
            state: [r.message_id for r in backend.page(JobFilter(state=state))[0]]
            for state in (None, "queued", "running", "succeeded", "retrying", "scheduled", "dead")
        },
    }


def test_a_batch_ends_as_its_updates_applied_one_by_one(store, twin):
    now = int(time.time() * 1000) // 60_000 * 60_000 - 60_000  # two per-minute buckets, both recent
    before, batch = mixed(now)
    merged, single = status_backend(store), status_backend(twin)
    merged.apply(before, TTL_MS)
    merged.apply(batch, TTL_MS)
    for update in before + batch:
        single.apply([update], TTL_MS)

    ids = sorted({u.message_id for u in before + batch})
    assert readable(store, ids, now) == readable(twin, ids, now)
    assert snapshot(store) == snapshot(twin)
    # and what they agree on is right
    records = readable(store, ids, now)["records"]
    assert {m: r["state"] for m, r in records.items()} == {
        "m1": "succeeded",
        "m2": "retrying",
        "m3": "running",
        "m4": "scheduled",
        "m5": "succeeded",
        "m6": "running",
        "m7": "dead",
        "m8": "running",
    }
    assert [e[0] for e in records["m3"]["timeline"]] == ["queued", "running"]
    assert [e[0] for e in records["m5"]["timeline"]] == ["skipped", "dead", "queued", "running", "succeeded"]
    assert records["m2"]["progress"] is None and records["m2"]["due_at"] is None
    pages = readable(store, ids, now)["pages"]
    assert pages["running"] == ["m8", "m6", "m3"] and pages["scheduled"] == ["m4"]
    assert status_backend(store).counts(["q1"])["q1"]["running"] == 9


def test_text_that_is_not_utf_8_does_not_hold_up_the_batch(store):
    """A lone surrogate (``str()`` of an exception about undecodable bytes) in an error message:
    the update is written (Redis stores ``?`` for it) along with the rest of its batch."""
    backend = status_backend(store)
    now = int(time.time() * 1000)
    failed = change("m1", "failed", 1, now, error_type="E", error="no file b'\udcff.txt'")
    backend.apply([failed, change("m2", "queued", 0, now)], TTL_MS)
    record = backend.get("m1")
    assert record is not None and record.error in ("no file b'\udcff.txt'", "no file b'?.txt'")
    assert backend.get("m2") is not None


def test_a_message_once_fields_leave_with_its_first_update_of_the_batch():
    """The script takes ``-1`` for the once-fields of the message's update before it
    (the batch tests above check it applies them alike); other messages' and changed ones are sent."""
    now = int(time.time() * 1000)
    updates = [
        change("m1", "queued", 0, now),
        change("m1", "running", 1, now + 1, attempts="1"),
        change("m2", "queued", 0, now),
        change("m1", None, 1, now + 2, progress="0.5"),  # a progress report: no once-fields
        change("m1", "succeeded", 1, now + 3),
    ]
    sent = sent_updates(json.loads(encode_updates(updates)))
    assert [once for _, once, _ in sent] == [ONCE_M1, None, ONCE_M2, {}, ONCE_M1]
    assert [deleted for _, _, deleted in sent] == [[], list(updates[1].delete), [], [], []]
    assert [fields for fields, _, _ in sent] == [dict(u.fields) for u in updates]


ONCE_M1 = {"actor": "a1", "queue": "q1"}
ONCE_M2 = {"actor": "a2", "queue": "q1"}


def sent_updates(flat: list[Any]) -> list[tuple[dict[str, str], dict[str, str] | None, list[str]]]:
    """The flat array the script reads, walked back into each update's fields, once-fields (None:
    not sent again; ``enqueued_at`` left out) and deleted names."""

    def named(at: int) -> dict[str, Any]:  # the count at ``at``, then the names, then the values
        names = flat[at + 1 : at + 1 + flat[at]]
        return dict(zip(names, flat[at + 1 + len(names) : at + 1 + 2 * len(names)], strict=True))

    sent: list[tuple[dict[str, str], dict[str, str] | None, list[str]]] = []
    at = 0
    while at < len(flat):
        fields = named(at + 3)
        at += 4 + 2 * flat[at + 3]
        once = None if flat[at] < 0 else {n: v for n, v in named(at).items() if n != "enqueued_at"}
        at += 1 + 2 * max(flat[at], 0)
        sent.append((fields, once, flat[at + 1 : at + 1 + flat[at]]))
        at += 1 + flat[at]
    return sent


def test_a_once_field_the_script_does_not_read_with_the_record_sees_the_batch_before_it(store):
    """``error_type`` is not read with the record: the batch's own earlier value keeps a once-field
    from replacing it, and the batch's deletion lets one in, as applied one at a time."""
    backend = status_backend(store)
    now = int(time.time() * 1000)

    def update(order: int, once: dict[str, str], delete: tuple[str, ...] = (), **fields: str) -> StatusUpdate:
        return StatusUpdate("m1", "q1", order, {"updated_at": str(now + order), **fields}, once, delete)

    set_then_kept = [update(11, {}, state="running", error_type="E1"), update(12, {"error_type": "E2"})]
    backend.apply(set_then_kept, TTL_MS)
    assert (record := backend.get("m1")) is not None and record.error_type == "E1"
    deleted_then_set = [update(13, {}, ("error_type",)), update(14, {"error_type": "E3"})]
    backend.apply(deleted_then_set, TTL_MS)
    assert (record := backend.get("m1")) is not None and record.error_type == "E3"


def test_a_batch_larger_than_one_index_call_files_every_job(store):
    """The index moves go out a few hundred members per call: none is lost at a boundary."""
    backend = status_backend(store)
    now = int(time.time() * 1000) // 60_000 * 60_000
    ids = [f"m{i}" for i in range(1, 1202)]
    backend.apply([change(m, "queued", 0, now) for m in ids], TTL_MS)
    backend.apply([change(m, "running", 1, now + 1) for m in ids[::2]], TTL_MS)
    assert backend.total(JobFilter()) == (1201, True)
    assert backend.total(JobFilter(state="queued")) == (600, True)
    assert backend.total(JobFilter(state="running")) == (601, True)


def test_a_record_changed_more_often_than_one_write_call_takes_keeps_the_last_values(store):
    """Hundreds of changes to one record in a batch are written in several calls, in order."""
    backend = status_backend(store)
    now = int(time.time() * 1000)
    reports = [change("m1", None, 1, now + i, progress=f"{i / 2000:.4f}") for i in range(1, 1601)]
    backend.apply([change("m1", "running", 1, now, attempts="1"), *reports], TTL_MS)
    record = backend.get("m1")
    assert record is not None and record.state == "running"
    assert (record.progress, record.updated_at) == (0.8, now + 1600)


def retried_history(message_id: str, now: int, attempts: int) -> list[StatusUpdate]:
    """A job that fails ``attempts`` times, its sender's ``queued`` arriving after its first run."""
    changes = [change(message_id, "running", 1, now, attempts="1", started_at=str(now))]
    changes.append(change(message_id, "queued", 0, now + 1))  # late: goes before the running
    for attempt in range(1, attempts + 1):
        at = now + 10 * attempt
        if attempt > 1:
            changes.append(change(message_id, "running", attempt, at, attempts=str(attempt)))
        changes.append(change(message_id, "failed", attempt, at + 1, error_type="E", error="boom"))
        changes.append(change(message_id, "retrying", attempt, at + 2, retry_at=str(at + 3)))
    return changes


def expected_timeline(changes: list[StatusUpdate]) -> list[Any]:
    """The timeline the changes leave, by the rules of ``add_to_timeline`` (applied one at a time)."""
    entries: list[Any] = []
    order, state = -1, None
    for update in changes:
        new_state, at = update.fields["state"], int(update.fields["updated_at"])
        if update.order < order:
            add_to_timeline(entries, new_state, at, update.order, late=True)
        elif new_state != state:
            add_to_timeline(entries, new_state, at, update.order)
            order, state = update.order, new_state
    return entries


@pytest.mark.parametrize("attempts", [5, 30])
@pytest.mark.parametrize("batch_size", [1, 2, 7, 1000])
def test_a_timeline_is_kept_alike_however_its_changes_are_batched(store, batch_size, attempts):
    """Below and past ``TIMELINE_MAX`` entries, with a late change among them, in batches of any
    size: the first entry and the latest ones, in order. On Redis the changes are appended to the
    stored text while they fit, so the field must be exactly what encoding the whole timeline gives."""
    backend, now = status_backend(store), int(time.time() * 1000)
    changes = retried_history("m1", now, attempts)
    for start in range(0, len(changes), batch_size):
        backend.apply(changes[start : start + batch_size], TTL_MS)
    expected = expected_timeline(changes)
    assert len(expected) == min(3 * attempts + 1, TIMELINE_MAX) and expected[0][0] == "queued"
    record = backend.get("m1")
    assert record is not None and record.timeline == expected
    if isinstance(store, RedisStore):
        stored = reply_text(store.client.hget(store.key("status:m1"), "timeline"))
        assert stored == json.dumps(expected, separators=(",", ":"))
