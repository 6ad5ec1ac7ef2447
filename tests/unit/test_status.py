"""The Status middleware in-process: its hooks called by a worker on a stub broker or directly,
records written to each state store backend."""

from __future__ import annotations

import json
from typing import Any

import dramatiq
import pytest
from dramatiq import Worker
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import CurrentMessage, Retries, SkipMessage

from jobsystem.dramatiq_internals import request_redelivery
from jobsystem.store.results import StoreResultBackend
from middleware.heartbeat import Heartbeat
from middleware.ratelimit import RateLimited
from middleware.results import StoreResults
from middleware.status import Status, progress
from tests.unit.stub import RecordingBroker, delivery


def test_progress_is_coalesced_and_errors_are_scrubbed(store, prefix):
    status = Status(store, scrub=lambda text: text.replace("4111-1111", "[card]"))
    progress_writes: list[int] = []
    apply = status.backend.apply

    def recording_apply(updates, ttl_ms):
        progress_writes.append(sum(u.progress_only for u in updates))
        apply(updates, ttl_ms)

    status.backend.apply = recording_apply  # type: ignore[method-assign]
    broker = StubBroker(middleware=[Retries(max_retries=0), CurrentMessage(), status])

    @dramatiq.actor(broker=broker, queue_name=f"{prefix}unit")
    def busy(count: int) -> None:
        for i in range(count):
            progress(i / count, note="busy")
        raise RuntimeError("card 4111-1111 declined")

    message = busy.send(20_000)
    worker = Worker(broker, worker_timeout=50)
    worker.start()
    try:
        broker.join(busy.queue_name, fail_fast=False)
        worker.join()
    finally:
        worker.stop()
    assert status.flush(10)
    record = status.get(message.message_id)
    assert record is not None and record.state == "dead"
    assert record.error == "card [card] declined" and record.progress == pytest.approx(1.0, abs=1e-3)
    # 20,000 reports, and each write to the store carried at most one of them: the latest.
    assert max(progress_writes) == 1 and sum(progress_writes) < 20_000
    assert progress(0.5) is False  # outside a job


@pytest.fixture
def tracked(store):
    status = Status(store, scrub=lambda text: text.replace("ana@example.com", "[email]"))
    broker = RecordingBroker(middleware=[status])
    actor = dramatiq.actor(broker=broker, actor_name="job", queue_name="q")(lambda: None)
    yield status, broker, actor
    status.writes.stop()


def state_of(status: Status, message_id: str) -> Any:
    assert status.flush(10)
    return status.get(message_id)


def test_a_job_goes_queued_running_failed_retrying_running_succeeded(tracked):
    status, broker, actor = tracked
    message = actor.message()
    status.after_enqueue(broker, message, None)
    assert state_of(status, message.message_id).state == "queued"
    first = delivery(message)
    status.before_process_message(broker, first)
    assert state_of(status, message.message_id).state == "running"
    status.after_process_message(broker, first, exception=ValueError("no mailbox for ana@example.com"))
    failed = state_of(status, message.message_id)
    assert (failed.state, failed.error_type, failed.error) == (
        "failed",
        "ValueError",
        "no mailbox for [email]",
    )
    retry = message.copy(options={"retries": 1, "eta": 123})
    status.after_enqueue(broker, retry, 1_000)  # Retries re-enqueueing the failed attempt
    assert (state_of(status, message.message_id).state, state_of(status, message.message_id).retry_at) == (
        "retrying",
        123,
    )
    second = delivery(retry)
    status.before_process_message(broker, second)
    status.after_process_message(broker, second, result={"id": 7})
    done = state_of(status, message.message_id)
    assert (done.state, done.attempts, done.result, done.progress, done.finished) == (
        "succeeded",
        2,
        {"id": 7},
        1.0,
        True,
    )


def test_a_late_queued_write_never_hides_a_running_job(tracked):
    status, broker, actor = tracked
    message = actor.message()
    status.before_process_message(broker, delivery(message))  # the worker wrote first
    status.after_enqueue(broker, message, None)  # the sender's record arrives late
    assert state_of(status, message.message_id).state == "running"


def test_a_deferred_message_stays_queued_and_a_skipped_duplicate_shows_skipped(tracked):
    status, broker, actor = tracked
    deferred = actor.message()
    status.after_enqueue(broker, deferred, None)
    status.after_enqueue(broker, deferred.copy(), 2_000)  # a guard re-enqueued it with a delay...
    status.after_skip_message(broker, delivery(deferred))  # ...and skipped it: it comes back
    assert state_of(status, deferred.message_id).state == "queued"
    duplicate = actor.message()
    status.after_skip_message(broker, delivery(duplicate))
    assert state_of(status, duplicate.message_id).state == "skipped"


def test_a_job_put_back_by_an_upstream_429_waits_queued_then_runs_its_attempt_again(tracked):
    """The actor raised RateLimited: Status sees the skip before RateLimits (placed before it)
    re-enqueues the message, so the skip must not count as final; the re-run is the same attempt."""
    status, broker, actor = tracked
    message = actor.message()
    first = delivery(message)
    status.before_process_message(broker, first)
    try:
        raise RateLimited(retry_after=2)
    except RateLimited:  # Dramatiq emits the skip hooks inside its except block, in reverse order
        status.after_skip_message(broker, first)
        status.after_enqueue(broker, message.copy(options={"eta": 123}), 2_000)  # RateLimits' hook
    status.after_ack(broker, first)
    waiting = state_of(status, message.message_id)
    assert (waiting.state, waiting.finished) == ("queued", False)
    again = delivery(message)
    status.before_process_message(broker, again)
    assert state_of(status, message.message_id).state == "running"
    status.after_process_message(broker, again, exception=ValueError("upstream down"))
    failed = state_of(status, message.message_id)
    assert (failed.state, failed.attempts) == ("failed", 1)
    assert [entry[0] for entry in failed.timeline] == ["running", "queued", "running", "failed"]
    assert status.backend.counts(["q"])["q"].get("skipped") is None


def test_a_result_too_deep_for_json_still_records_the_success(tracked):
    status, broker, actor = tracked
    message = actor.message()
    nested: list[Any] = []
    for _ in range(100_000):
        nested = [nested]
    status.before_process_message(broker, delivery(message))
    status.after_process_message(broker, delivery(message), result=nested)
    record = state_of(status, message.message_id)
    assert (record.state, record.result) == ("succeeded", None)


def test_notes_tracebacks_and_shown_arguments_keep_personal_data_out(store):
    """A progress note is the actor's text; a traceback is cut to its tail, and a value cut in
    two escapes its pattern; shown arguments hold structures, whose values under a personal-data
    key a scrub of their JSON text leaves alone."""
    from jobsystem.privacy.scrub import Scrubber

    scrubber = Scrubber()
    status = Status(store, scrub=scrubber.text, scrub_value=scrubber, traceback_max_chars=300)
    broker = RecordingBroker(middleware=[Heartbeat(store), status])  # Heartbeat declares dashboard_args
    ship = dramatiq.actor(broker=broker, actor_name="ship", queue_name="q", dashboard_args=True)(
        lambda **kwargs: None
    )
    address = {"line1": "12 Rue Lepic", "city": "Paris"}
    message = ship.message_with_options(kwargs={"address": address, "name": {"last": "Lopez"}})
    status.after_enqueue(broker, message, None)
    running = delivery(message)
    status.before_process_message(broker, running)
    status.report_progress(running, 0.5, "sending to ana.lopez@example.com")
    assert "ana.lopez" not in state_of(status, message.message_id).note
    iban = "DE89 3704 0044 0532 0130 00"
    try:
        raise ValueError(f"refund to IBAN {iban} refused: " + "x" * 275)
    except ValueError as exc:  # the last 300 characters begin inside the IBAN
        status.after_process_message(broker, running, exception=exc)
    record = state_of(status, message.message_id)
    assert "0532 0130" not in record.traceback and "Rue Lepic" not in json.dumps(record.args)
    assert "Lopez" not in json.dumps(record.args)
    status.writes.stop()


def test_a_deferral_refused_by_rabbitmq_leaves_the_job_queued_and_its_result_unset(tracked, store):
    # The deferral's copy could not be published: the delivery is requeued, not the job's end.
    status, broker, actor = tracked
    results = StoreResults(StoreResultBackend(store, scrub=str), result_ttl=60_000)
    broker.add_middleware(results)
    stored = dramatiq.actor(broker=broker, actor_name="stored", queue_name="q", store_results=True)(lambda: 1)
    for message in (actor.message(), stored.message()):
        status.after_enqueue(broker, message, None)
        refused = delivery(message)
        request_redelivery(refused)
        try:
            raise SkipMessage("rate limited: deferred")
        except SkipMessage:
            status.after_skip_message(broker, refused)
            results.after_skip_message(broker, refused)
        assert state_of(status, message.message_id).state == "queued"
    assert not results.backend.has_result(stored.message().copy(message_id=message.message_id))


def test_a_nacked_message_is_dead_unless_its_dead_letter_was_refused(tracked):
    status, broker, actor = tracked
    dead, held = actor.message(), actor.message()
    status.after_nack(broker, delivery(dead))
    refused = delivery(held)
    request_redelivery(refused)
    status.after_nack(broker, refused)
    assert state_of(status, dead.message_id).state == "dead"
    assert state_of(status, held.message_id) is None  # dead only once the consumer published it
    assert status.backend.counts(["q"])["q"] == {"dead": 1}
