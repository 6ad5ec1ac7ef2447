"""Job status and progress end to end: real workers, real RabbitMQ, each state store backend."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from functools import partial

import pytest

from jobsystem.store import open_store
from jobsystem.store.status import status_backend
from jobsystem.store.status_records import JobStatus
from tests import workload
from tests.queues import Queues
from tests.senders import sender_broker
from tests.support import BIN, ROOT, TEST_REDIS_URL, wait_for, worker_env
from tests.workers import wait_for_final_events


def sending_and_reading(
    queues: Queues, prefix: str, state_url: str
) -> tuple[Queues, Callable[[str], JobStatus | None]]:
    """Send through a broker whose status records go to ``state_url``; read them back."""
    sender = queues.using(sender_broker(prefix, state_url))
    reader = status_backend(open_store(state_url, namespace=f"jobs:{prefix}"))
    return sender, reader.get


@pytest.fixture
def each_store(queues, prefix, state_url):
    """Each state store backend in turn (the worker must be given ``STATE_URL=state_url``)."""
    return sending_and_reading(queues, prefix, state_url)


@pytest.fixture
def tracked(queues, prefix):
    """The tests' Redis, which workers use by default."""
    return sending_and_reading(queues, prefix, TEST_REDIS_URL)


def poll(
    read: Callable[[str], JobStatus | None],
    message_id: str,
    history: list[tuple[str, float | None]],
    condition: Callable[[JobStatus], bool],
) -> JobStatus | None:
    """Poll helper: the current record if it meets ``condition``; notes each (state, progress) seen."""
    record = read(message_id)
    if record is None:
        return None
    if not history or history[-1] != (record.state, record.progress):
        history.append((record.state, record.progress))
    return record if condition(record) else None


def finished(record: JobStatus) -> bool:
    return record.finished


def at_progress(progress: float) -> Callable[[JobStatus], bool]:
    """A ``poll`` condition: the record shows ``progress`` (to within rounding)."""
    return lambda record: record.progress is not None and abs(record.progress - progress) < 1e-3


def test_status_goes_queued_running_succeeded_with_progress_seen_mid_run(
    start_worker, each_store, store, prefix, state_url, tmp_path
):
    sender, read = each_store
    message = sender.send(workload.staged, "s1", 3)
    queued = wait_for(lambda: read(message.message_id), what="the queued record")
    assert (queued.state, queued.actor, queued.attempts) == ("queued", "staged", 0)
    assert queued.queue == sender.name(workload.staged) and queued.enqueued_at == message.message_timestamp

    start_worker(STATE_URL=state_url)
    history: list[tuple[str, float | None]] = []
    for step in range(3):
        record = wait_for(
            partial(poll, read, message.message_id, history, at_progress(step / 3)),
            what=f"progress of step {step}",
        )
        assert record.state == "running" and record.note == f"step {step}" and record.attempts == 1
        store.set(f"test:{prefix}go:s1:{step}", 1)
    done = wait_for(lambda: poll(read, message.message_id, history, finished), what="the final state")
    assert (done.state, done.progress, done.result, done.error) == ("succeeded", 1.0, {"steps": 3}, None)
    assert done.enqueued_at <= done.started_at <= done.finished_at
    states = [state for i, (state, _) in enumerate(history) if i == 0 or history[i - 1][0] != state]
    assert states[-2:] == ["running", "succeeded"] and states[:-2] in ([], ["queued"])  # never backwards

    # The operators' view of the same record.
    env = worker_env(prefix, tmp_path, STATE_URL=state_url)
    shown = subprocess.run(
        [str(BIN / "jobctl"), "status", message.message_id, "--json"], env=env, cwd=ROOT, capture_output=True
    )
    assert shown.returncode == 0, shown.stderr
    assert JobStatus(**json.loads(shown.stdout)) == done
    unknown = subprocess.run(
        [str(BIN / "jobctl"), "status", "no-such-id"], env=env, cwd=ROOT, capture_output=True
    )
    assert unknown.returncode == 1


def test_retried_job_shows_retrying_then_its_final_state(start_worker, tracked):
    sender, read = tracked
    start_worker(JOB_MIN_BACKOFF_MS="1500")
    message = sender.send(workload.flaky, "r1", failures=1)
    history: list[tuple[str, float | None]] = []
    retrying = wait_for(
        lambda: poll(read, message.message_id, history, lambda r: r.state == "retrying"), what="retrying"
    )
    assert retrying.retry_at is not None and retrying.error_type == "RuntimeError"
    done = wait_for(lambda: poll(read, message.message_id, history, finished), what="the final state")
    assert (done.state, done.attempts, done.result) == ("succeeded", 2, 2)
    # The last failure's error stays on the record.
    assert done.error_type == "RuntimeError" and "fails on purpose" in (done.error or "")
    states = [s for s, _ in history]
    assert states.index("retrying") < states.index("succeeded")


def test_dead_lettered_job_shows_dead_with_its_error(start_worker, tracked, queues):
    sender, read = tracked
    start_worker(JOB_MAX_RETRIES="1", JOB_MIN_BACKOFF_MS="100")
    thrown = sender.send(workload.permanent, "p1")
    exhausted = sender.send(workload.flaky, "p2", failures=100)
    dead = wait_for(lambda: poll(read, thrown.message_id, [], finished), what="the thrown job")
    assert (dead.state, dead.attempts, dead.error_type, dead.error) == (
        "dead",
        1,
        "Permanent",
        "this cannot succeed",
    )
    dead = wait_for(lambda: poll(read, exhausted.message_id, [], finished), what="the exhausted job")
    assert (dead.state, dead.attempts, dead.error_type) == ("dead", 2, "RuntimeError")
    assert queues.depth(queues.name(workload.permanent) + ".DLQ") == 2


def test_a_deferred_message_stays_queued_and_a_duplicate_delivery_never_hides_success(
    start_worker, tracked, store, prefix
):
    sender, read = tracked
    worker = start_worker(threads=2)
    options = {"idempotency_drop_duplicates": False}
    first = sender.send_with_options(workload.effect, args=("d1",), kwargs={"seconds": 2.0}, **options)
    wait_for(lambda: store.llen(f"test:{prefix}started:d1") == 1, what="the first run")
    second = sender.send_with_options(workload.effect, args=("d1",), **options)
    wait_for(lambda: "duplicate_deferred" in worker.output(), what="the deferral of the second")
    # Deferred, not skipped (its record is written a few milliseconds after the event).
    assert wait_for(lambda: read(second.message_id)).state == "queued"
    assert wait_for(lambda: poll(read, first.message_id, [], finished)).state == "succeeded"
    assert wait_for(lambda: poll(read, second.message_id, [], finished)).state == "skipped"
    # The same message delivered again after its success is skipped, and its record says succeeded.
    sender.publish_raw(first)
    outcomes = wait_for_final_events([worker], {first.message_id: 2, second.message_id: 1})
    assert outcomes[first.message_id] == {"job_succeeded": 1, "duplicate_skipped": 1}
    assert outcomes[second.message_id] == {"duplicate_skipped": 1}
    assert read(first.message_id).state == "succeeded"
