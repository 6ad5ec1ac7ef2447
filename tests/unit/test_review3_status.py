"""Review 3, status and progress: faults found by reading, fixed since (each test failed before).

- The Redis job index trimmed its entries by the job's send time, not by the record's life: a job
  sent longer than ``JOB_STATUS_TTL_MS`` ago (every job delayed longer than the TTL, a job
  retried for longer) was left out of the dashboard's job list and state filters while its record
  lived, scheduled or finished. The SQLite index keeps it for as long as the record (the control).
- A progress note was cut to 200 characters before it was scrubbed: a personal value that the cut
  split no longer matched its pattern, and its first half was stored and shown.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import dramatiq
import pytest

from jobsystem.privacy.scrub import Scrubber
from jobsystem.store.job_index import JobFilter
from jobsystem.store.status import StatusBackend
from middleware.status import Status
from tests.support import fresh_store
from tests.unit.stub import RecordingBroker, delivery

#: The records' TTL here (a minute stands for JOB_STATUS_TTL_MS's day) and how long ago the job
#: was sent (ten minutes stand for a report scheduled ten days ahead, run today).
TTL_MS, SENT_AGO_MS = 60_000, 600_000


def listed(backend: StatusBackend, job_filter: JobFilter) -> list[str]:
    """The message ids of the first page of the job index under ``job_filter``."""
    records, _ = backend.page(job_filter, None, 50)
    return [record.message_id for record in records]


@pytest.mark.parametrize(
    "kind",
    [
        "redis",
        "sqlite",  # the control: its index entry lives as long as the record
    ],
)
def test_a_job_sent_longer_ago_than_the_status_ttl_stays_listed_while_its_record_lives(
    kind: str, tmp_path: Path
) -> None:
    """A report sent with a delay longer than the TTL: its record is kept until it is due and the
    TTL after (README, *Job status*: "scheduled ... its record is kept until due_at +
    JOB_STATUS_TTL_MS"), and it is "filed in the job index the dashboard lists jobs from". When
    it runs, its send time is older than the TTL. On Redis every write of a set of the index
    trimmed the members scored (by send time) before now - TTL: the job was gone from the Jobs
    page, its state filters and its queue's list the moment it was filed, while ``get_status`` and
    the job's own page still found it."""
    with fresh_store(kind, tmp_path) as store:
        status = Status(store, ttl_ms=TTL_MS, scheduled_after_ms=30_000)
        broker = RecordingBroker(middleware=[status])
        actor = dramatiq.actor(broker=broker, actor_name="report", queue_name="q")(lambda: None)
        try:
            now = int(time.time() * 1000)
            message = actor.message().copy(message_timestamp=now - SENT_AGO_MS)
            # Waiting in RabbitMQ (a retry of it with a backoff past the horizon, say).
            waiting = message.copy(queue_name="q.DQ", options={"eta": now + 120_000})
            status.after_enqueue(broker, waiting, 120_000)
            assert status.flush(10)
            record = status.get(message.message_id)
            assert record is not None and record.state == "scheduled"
            assert message.message_id in listed(status.backend, JobFilter(state="scheduled"))
            # It is due, and runs.
            running = delivery(message)
            status.before_process_message(broker, running)
            status.after_process_message(broker, running, result=None)
            assert status.flush(10)
            done = status.get(message.message_id)
            assert done is not None and done.state == "succeeded"
            assert message.message_id in listed(status.backend, JobFilter(state="succeeded"))
            assert message.message_id in listed(status.backend, JobFilter(queue="q"))
            assert message.message_id in listed(status.backend, JobFilter())
        finally:
            status.writes.stop()


def note_straddling(address: str, at: int = 200) -> str:
    """A progress note longer than the 200 characters kept, with ``address`` across the cut."""
    start = at - len(address) // 2
    head = ("640px written; notifying the owner of the upload " + "frame " * 40)[: start - 1] + " "
    return head + address + " when the 1280px rendition is done"


def test_a_progress_note_is_scrubbed_whole_before_it_is_cut(store: Any) -> None:
    """The same rule as the traceback's (``Status._trace``: "scrubbed before the cut: a value cut in
    two would no longer match its pattern") and the scrubber's own cut (at a space: "half an email
    address would escape its pattern"). The note is stored, shown on the job's page to viewers and
    returned by ``get_status`` to the application's status endpoint."""
    scrubber = Scrubber()
    status = Status(store, scrub=scrubber.text)
    broker = RecordingBroker(middleware=[status])
    actor = dramatiq.actor(broker=broker, actor_name="render", queue_name="q")(lambda: None)
    message = actor.message()
    running = delivery(message)
    try:
        status.before_process_message(broker, running)
        note = note_straddling("ana.lopez@example.com")
        assert "ana.lopez" not in scrubber.text(note)  # the note whole is scrubbed
        status.report_progress(running, 0.5, note)
        assert status.flush(10)
        record = status.get(message.message_id)
        assert record is not None and record.note is not None
        assert "ana.lopez" not in record.note, record.note
    finally:
        status.writes.stop()
