"""The worker on the real RabbitMQ: jobs run, retries back off then fail, shutdown loses nothing."""

from __future__ import annotations

import itertools
import json
import signal

from actors.bulk import send_bulk
from tests import workload
from tests.support import wait_for


def test_job_sent_from_another_process_runs(start_worker, queues, store, prefix):
    start_worker()
    queues.send(workload.record, "hello")
    wait_for(lambda: store.sismember(f"test:{prefix}tokens", "hello"), what="the job's run")


def test_failing_job_is_retried_with_backoff_then_dead_lettered(start_worker, queues, store, prefix):
    start_worker(JOB_MAX_RETRIES="3", JOB_MIN_BACKOFF_MS="200")
    message = queues.send(workload.flaky, "f1", failures=100)
    dead = queues.name(workload.flaky) + ".DLQ"
    wait_for(lambda: queues.depth(dead) == 1, what="the dead letter")
    attempts = [float(t) for t in store.lrange(f"test:{prefix}attempt:f1", 0, -1)]
    assert len(attempts) == 4  # the first attempt and 3 retries
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    # min_backoff * 2**n * U[1, 2): each gap is at least the exponential floor.
    for n, gap in enumerate(gaps):
        assert gap >= 0.2 * 2**n * 0.95, gaps
    body = json.loads(queues.peek(dead)[0]["payload"])
    assert body["message_id"] == message.message_id
    assert store.llen(f"test:{prefix}effect:f1") == 0


def test_job_that_fails_then_succeeds_runs_its_effect_once(start_worker, queues, store, prefix):
    start_worker()
    queues.send(workload.flaky, "f2", failures=2)
    wait_for(lambda: store.llen(f"test:{prefix}effect:f2") == 1, what="the successful attempt")
    assert store.llen(f"test:{prefix}attempt:f2") == 3


def test_non_retryable_error_fails_at_once(start_worker, queues, store, prefix):
    start_worker(JOB_MAX_RETRIES="5")
    queues.send(workload.permanent, "p1")
    dead = queues.name(workload.permanent) + ".DLQ"
    wait_for(lambda: queues.depth(dead) == 1, what="the dead letter")
    assert store.llen(f"test:{prefix}attempt:p1") == 1
    assert queues.depth(dead[: -len(".DLQ")] + ".DQ") == 0


def test_sigterm_lets_the_running_job_finish_and_loses_nothing(start_worker, queues, store, prefix):
    worker = start_worker(threads=1)
    queues.send(workload.slow, "s1", seconds=3)
    for i in range(5):
        queues.send(workload.record, f"later-{i}")
    wait_for(lambda: store.llen(f"test:{prefix}started:s1") == 1, what="the slow job to start")
    assert worker.stop(signal.SIGTERM) == 0
    assert store.llen(f"test:{prefix}finished:s1") == 1
    # What the worker had not run yet is back in the queue, none lost, and runs on the next worker.
    ran = store.scard(f"test:{prefix}tokens")
    assert queues.depth(queues.name(workload.record)) == 5 - ran
    start_worker()
    wait_for(lambda: store.scard(f"test:{prefix}tokens") == 5, what="the remaining jobs")
    assert store.llen(f"test:{prefix}started:s1") == 1


def test_bulk_send_of_ten_thousand_delivers_exactly_ten_thousand(start_worker, queues, store, prefix):
    messages = [queues.message(workload.record, f"b{i}") for i in range(10_000)]
    confirmed = send_bulk(messages)
    assert len(confirmed) == 10_000
    assert queues.depth(queues.name(workload.record)) == 10_000
    start_worker(processes=2, threads=8)
    wait_for(
        lambda: int(store.get(f"test:{prefix}count:record") or 0) >= 10_000, timeout=120, what="10,000 runs"
    )
    wait_for(lambda: queues.depth(queues.name(workload.record)) == 0, what="an empty queue")
    assert int(store.get(f"test:{prefix}count:record")) == 10_000
    assert store.scard(f"test:{prefix}tokens") == 10_000


def test_priority_puts_premium_messages_first(queues):
    queue = queues.name(workload.record)
    for i in range(3):
        queues.send(workload.record, f"free-{i}")
    premium = workload.record.message_with_options(args=("premium",), broker_priority=9).copy(
        queue_name=queue
    )
    import actors

    actors.broker.enqueue(premium)
    first = json.loads(queues.peek(queue, count=1)[0]["payload"])
    assert first["args"] == ["premium"]
