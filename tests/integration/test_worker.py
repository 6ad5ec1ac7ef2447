"""The worker on the real RabbitMQ: jobs run, retries back off then fail, shutdown loses nothing."""

from __future__ import annotations

import itertools
import json
import os
import signal

from jobsystem.rabbitmq.bulk import send_bulk
from jobsystem.system import get_system
from tests import workload
from tests.support import wait_for
from tests.workers import wait_for_final_events


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
    worker = start_worker(JOB_MAX_RETRIES="5")
    message = queues.send(workload.permanent, "p1")
    dead = queues.name(workload.permanent) + ".DLQ"
    (record,) = queues.wait_finished([message]).values()
    assert (record.state, record.attempts) == ("dead", 1)
    assert wait_for_final_events([worker], {message.message_id: 1})[message.message_id] == {
        "job_dead_lettered": 1
    }
    assert not worker.events("job_retry_scheduled", message_id=message.message_id)  # never retried
    assert store.llen(f"test:{prefix}attempt:p1") == 1
    assert queues.depth(dead) == 1


def test_sigterm_lets_the_running_job_finish_and_loses_nothing(start_worker, queues, store, prefix):
    worker = start_worker(threads=1)
    sent = [queues.send(workload.slow, "s1", seconds=3)]
    sent += [queues.send(workload.record, f"later-{i}") for i in range(5)]
    wait_for(lambda: store.llen(f"test:{prefix}started:s1") == 1, what="the slow job to start")
    assert worker.stop(signal.SIGTERM) == 0
    assert store.llen(f"test:{prefix}finished:s1") == 1
    # What the worker had not run yet is back in the queue (no consumer now: the count is exact),
    # none lost, and the slow job, finished and acked, is not: it runs on the next worker.
    ran = store.scard(f"test:{prefix}tokens")
    queue = queues.name(workload.record)
    assert queues.depth(queue) == 5 - ran
    second = start_worker()
    outcomes = wait_for_final_events([worker, second], {m.message_id: 1 for m in sent})
    assert all(events == {"job_succeeded": 1} for events in outcomes.values()), outcomes
    assert queues.left_after_stop([second], queue) == 0
    assert store.llen(f"test:{prefix}started:s1") == 1
    assert store.scard(f"test:{prefix}tokens") == 5 and store.get(f"test:{prefix}count:record") == "5"


def test_bulk_send_of_ten_thousand_delivers_exactly_ten_thousand(start_worker, queues, store, prefix):
    messages = [queues.message(workload.record, f"b{i}") for i in range(10_000)]
    confirmed = send_bulk(messages, broker=queues.broker)
    assert len(confirmed) == 10_000
    assert queues.depth(queues.name(workload.record)) == 10_000
    worker = start_worker(processes=2, threads=8)
    queue = queues.name(workload.record)
    # Every message reached "succeeded" (the counters count each message once); then nothing is
    # left anywhere, and no message ran twice.
    queues.wait_totals(queue, timeout=120, succeeded=10_000)
    assert queues.left_after_stop([worker], queue) == 0
    assert int(store.get(f"test:{prefix}count:record")) == 10_000
    assert store.scard(f"test:{prefix}tokens") == 10_000


def test_priority_puts_premium_messages_first(queues):
    queue = queues.name(workload.record)
    for i in range(3):
        queues.send(workload.record, f"free-{i}")
    premium = workload.record.message_with_options(args=("premium",), broker_priority=9).copy(
        queue_name=queue
    )
    queues.broker.enqueue(premium)
    first = json.loads(queues.peek(queue, count=1)[0]["payload"])
    assert first["args"] == ["premium"]


def test_rabbitmq_max_priority_0_declares_plain_queues_that_a_worker_so_configured_consumes(
    start_worker, queues, store, prefix
):
    from jobsystem.settings import load_settings
    from jobsystem.system import build_system

    plain = build_system(
        load_settings({**os.environ, "QUEUE_PREFIX": prefix, "RABBITMQ_MAX_PRIORITY": "0"})
    ).broker
    plain.actors.update(get_system().broker.actors)
    queue = queues.name(workload.record)
    plain.declare_queue(queue, ensure=True)
    for name in (queue, f"{queue}.DQ"):
        arguments = queues.info(name)["arguments"]
        assert "x-max-priority" not in arguments and arguments["x-dead-letter-routing-key"] == queue
    start_worker(RABBITMQ_MAX_PRIORITY="0")
    plain.enqueue(queues.message(workload.record, "plain"))
    wait_for(lambda: store.sismember(f"test:{prefix}tokens", "plain"), what="the job's run")


def test_worker_prefetch_is_each_queue_consumers_prefetch(start_worker, queues):
    """``WORKER_PREFETCH`` sets what each worker process's consumer prefetches; 0 (the default)
    leaves Dramatiq's twice the threads."""
    queue = queues.name(workload.record)

    def prefetch_counts(consumers: int) -> list[int] | None:
        """Each consumer's prefetch, once RabbitMQ lists ``consumers`` of them."""
        details = queues.info(queue).get("consumer_details") or []
        return sorted(c["prefetch_count"] for c in details) if len(details) == consumers else None

    start_worker(threads=3, WORKER_PREFETCH="5")
    queues.wait_consumers(queue, 1)
    assert wait_for(lambda: prefetch_counts(1), what="the consumer's details") == [5]
    start_worker(threads=3)
    queues.wait_consumers(queue, 2)
    assert wait_for(lambda: prefetch_counts(2), what="both consumers' details") == [5, 6]
