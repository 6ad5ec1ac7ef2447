"""A real ``dramatiq`` worker sends lifecycle lines to its parent in batches
(:mod:`jobsystem.observability.batched_stream`): none is lost or doubled by a SIGTERM stop, none
waits for more to come, and every line arrives whole."""

from __future__ import annotations

import signal
from collections import Counter

from jobsystem.rabbitmq.bulk import send_bulk
from tests import workload
from tests.support import wait_for
from tests.workers import json_lines, wait_for_final_events

LIFECYCLE = ("job_started", "job_succeeded")


def test_every_job_logs_started_and_succeeded_once_after_a_sigterm_stop(start_worker, queues, store, prefix):
    # Batches leave only when full, with an ordinary line, or at shutdown; Dramatiq's worker logs
    # nothing at INFO (tests.workload): the slow jobs end after the stop began, so only the
    # shutdown flush can send their lines.
    worker = start_worker(processes=2, threads=8, LOG_LEVEL="INFO", TEST_LOG_BATCH_INTERVAL="600")
    records = [queues.message(workload.record, f"r{i}") for i in range(500)]
    assert len(send_bulk(records, broker=queues.broker)) == 500
    wait_for(lambda: store.get(f"test:{prefix}count:record") == "500", timeout=60, what="500 records")
    slow = [queues.send(workload.slow, f"s{i}", seconds=1.5) for i in range(4)]
    started = [f"test:{prefix}started:s{i}" for i in range(4)]
    wait_for(lambda: all(store.llen(k) == 1 for k in started), what="the slow jobs to start")
    assert worker.stop(signal.SIGTERM) == 0
    assert all(store.llen(f"test:{prefix}finished:s{i}") == 1 for i in range(4))
    output = worker.output()
    # Whole lines only: every line that starts as JSON is a complete object.
    starts = [line for line in output.splitlines() if line.startswith("{")]
    lines = json_lines(output)
    assert len(lines) == len(starts)
    seen: dict[str, list[str]] = {m.message_id: [] for m in [*records, *slow]}
    for line in lines:
        if line.get("event") in LIFECYCLE and line.get("message_id") in seen:
            seen[line["message_id"]].append(line["event"])
    wrong = {m: events for m, events in seen.items() if events != list(LIFECYCLE)}
    assert wrong == {}, f"{len(wrong)} jobs without exactly one started, then one succeeded line"
    events = [line["event"] for line in lines if line.get("message_id") in seen]
    assert Counter(events) == {"job_started": 504, "job_succeeded": 504}


def test_a_lone_job_is_logged_without_waiting_for_more(start_worker, queues):
    worker = start_worker(LOG_LEVEL="INFO")
    message = queues.send(workload.record, "alone")
    # The flusher sends it within its interval (50 ms); the worker keeps running.
    outcome = wait_for_final_events([worker], {message.message_id: 1}, timeout=5)
    assert outcome == {message.message_id: {"job_succeeded": 1}}
    assert worker.events("job_started", message_id=message.message_id) != []
    assert worker.proc.poll() is None
