"""Delays of any length, held by RabbitMQ: a delay past the horizon waits in the delay cascade,
reaches the delay queue about a second before it is due and runs on time, with no worker holding
it meanwhile; retry backoffs and rate-limit reservations of hours are scheduled the same way.

The RabbitMQ restart is in ``test_delays_restart.py`` (it disturbs every other test running)."""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pika
import pytest
import requests
from dramatiq.errors import ConnectionClosed

from jobsystem.ops.health import check
from jobsystem.rabbitmq.bulk import send_bulk
from jobsystem.rabbitmq.delays import MAX_DELAY_MS
from jobsystem.settings import load_settings
from jobsystem.store import open_store
from jobsystem.system import get_system
from tests import workload
from tests.delay_support import (
    cascade_contents,
    consumer_timeout,
    in_cascade,
    refusing_cascade,
    send_delayed,
    short_horizon,
    unacked,
)
from tests.support import TEST_REDIS_URL, wait_for


def get_one(queue: str, timeout: float) -> tuple[float, pika.spec.BasicProperties, dict[str, Any]]:
    """Wait for a message in ``queue`` (no consumer): when it came, its properties and body."""
    connection = pika.BlockingConnection(pika.URLParameters(get_system().settings.rabbitmq_url))
    try:
        channel = connection.channel()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            method, properties, body = channel.basic_get(queue, auto_ack=False)
            if method is not None:
                arrived = time.time()
                channel.basic_nack(method.delivery_tag, requeue=True)
                return arrived, properties, json.loads(body)
            time.sleep(0.005)
    finally:
        connection.close()
    raise AssertionError(f"nothing reached {queue} within {timeout} s")


def test_a_delay_waits_in_rabbitmq_and_reaches_its_delay_queue_with_its_options(queues, prefix):
    sender = short_horizon(queues, prefix)
    message = send_delayed(sender, workload.effect, 4_600, "opts", broker_priority=7)
    eta = message.options["eta"]
    # Watched from now, so that its arrival is timed however long the checks below take (peeking
    # each level through the management API can outlast the 3 s the message spends there).
    watch = ThreadPoolExecutor(max_workers=1)
    arrival = watch.submit(get_one, queues.name(workload.effect) + ".DQ", timeout=10)
    watch.shutdown(wait=False)
    (waiting,) = wait_for(lambda: cascade_contents(queues), timeout=5, what="the message in the cascade")
    # 4.6 s: 3 s in the cascade (levels 1 and 0), the last 1.6 s in the delay queue.
    assert (waiting["queue"], waiting["seconds"], waiting["properties"]["priority"]) == (
        f"{prefix}delay.L1",
        3,
        7,
    )
    record = sender.status(message.message_id) or wait_for(lambda: sender.status(message.message_id))
    assert (record.state, record.due_at) == ("scheduled", eta)
    arrived, properties, body = arrival.result()
    # It leaves the cascade before it is due, at most two seconds before: RabbitMQ's expiry runs
    # late on a loaded machine (1.2 s was seen in CI), so the levels' own TTLs are checked below.
    assert 0.0 < eta / 1000 - arrived <= 2.0
    ttls = {level: queues.info(f"{prefix}delay.L{level}")["arguments"]["x-message-ttl"] for level in (0, 1)}
    assert ttls == {0: 1000, 1: 2000}
    assert properties.priority == 7 and properties.delivery_mode == 2
    assert body["message_id"] == message.message_id and body["options"]["eta"] == eta
    assert body["options"]["idempotency_registered"] is True  # its key went through the wait
    deaths = {d["queue"]: d["reason"] for d in properties.headers["x-death"]}
    assert deaths == {f"{prefix}delay.L1": "expired", f"{prefix}delay.L0": "expired"}
    # A duplicate sent meanwhile is dropped: the key stays pending while the job waits.
    again = send_delayed(sender, workload.effect, 4_600, "opts")
    assert again.options.get("duplicate") is True and again.message_id == message.message_id


def test_a_cascade_deleted_under_a_sender_is_declared_again_and_strays_are_kept_and_seen(
    queues, prefix, store
):
    sender = short_horizon(queues, prefix)
    send_delayed(sender, workload.record, 60_000, "first")
    cascade = sender.broker.delays
    sender.broker.channel.exchange_delete(cascade.exchange_for(59))  # where 60 s go
    second = send_delayed(sender, workload.record, 60_000, "second")  # 404, declared again, published
    assert sum(in_cascade(prefix).values()) == 2 and second.options["eta"]
    # A message leaving the cascade for a queue nobody binds is kept, not dropped.
    sender.broker.channel.basic_publish(
        cascade.entry,
        "0." * 28 + "1.nowhere.DQ",
        b"{}",
        pika.BasicProperties(delivery_mode=2),
        mandatory=True,
    )
    wait_for(lambda: queues.depth(cascade.unroutable) == 1, timeout=10, what="the stray kept")
    # ... and seen: nothing consumes it, so `jobctl health` (and its alerts) name it.
    settings = load_settings({**os.environ, "QUEUE_PREFIX": prefix, "STATE_URL": TEST_REDIS_URL})
    state = open_store(settings.state_url, namespace=settings.state_namespace)
    report = check([queues.name(workload.record)], config=settings, state=state)
    assert (
        "unroutable_delays",
        f"1 delayed messages found no delay queue, waiting in {cascade.unroutable}",
    ) in [(p.kind, p.detail) for p in report.problems]
    assert report.status == "degraded"


@pytest.mark.exclusive  # RabbitMQ's consumer_timeout is one for all: set for this test alone
def test_delays_past_the_consumer_timeout_run_on_time_once_across_a_worker_restart(
    start_worker, queues, store, prefix
):
    queue = queues.name(workload.slow)
    worker_env = {"RABBITMQ_CONSUMER_TIMEOUT_MS": "60000", "JOB_TIME_LIMIT_MS": "50000"}
    with consumer_timeout(60_000):
        worker = start_worker(**worker_env)
        short = send_delayed(queues, workload.slow, 75_000, "d75", 0)
        long = send_delayed(queues, workload.effect, 100_000, "d100")
        due = {"d75": short.options["eta"] / 1000, "d100": long.options["eta"] / 1000}
        wait_for(lambda: all(queues.status(m.message_id) for m in (short, long)), what="records")
        assert {queues.status(m.message_id).state for m in (short, long)} == {"scheduled"}
        assert sum(in_cascade(prefix).values()) == 2
        samples: list[tuple[float, int]] = []
        restarted = False
        while time.time() < due["d100"] - 3:
            if not restarted and time.time() > due["d75"] - 45:  # a new worker mid-wait
                assert worker.stop() == 0
                worker = start_worker(**worker_env)
                restarted = True
            samples.append((time.time(), unacked(queues, queue)))
            time.sleep(1)
        records = queues.wait_finished([short, long], timeout=30)
    assert {r.state for r in records.values()} == {"succeeded"}
    for token in ("d75", "d100"):
        (started,) = [float(t) for t in store.lrange(f"test:{prefix}started:{token}", 0, -1)]
        assert abs(started - due[token]) <= 3, f"{token} ran {started - due[token]:+.2f} s from due"
    assert store.llen(f"test:{prefix}effect:d100") == 1
    # Nothing held unacked while waiting: only the last stretch of d75 (the management API's
    # samples lag up to 5 s) falls between its due time and the next wait.
    waiting = [n for t, n in samples if t < due["d75"] - 3 or t > due["d75"] + 8]
    assert len(waiting) > 60 and max(waiting) == 0, samples
    assert "consumer_timeout" not in worker.output() and "PRECONDITION_FAILED" not in worker.output()


def test_a_plain_dramatiq_worker_releases_delayed_jobs_within_a_tenth_of_a_second(
    start_worker, queues, store, prefix
):
    # Dramatiq releases a due message on its consumer's tick, 1 s unless the environment sets
    # ``dramatiq_worker_timeout`` (``jobctl worker`` does; ``dramatiq actors`` does not): due
    # times spread over a second show it, each then up to a second late.
    start_worker()
    sent = [send_delayed(queues, workload.slow, 1_000 + 170 * i, f"t{i}", 0) for i in range(6)]
    queues.wait_finished(sent, timeout=30)
    late = {}
    for i, message in enumerate(sent):
        (started,) = [float(t) for t in store.lrange(f"test:{prefix}started:t{i}", 0, -1)]
        late[f"t{i}"] = round(started - message.options["eta"] / 1000, 3)
    assert all(-0.005 <= seconds < 0.4 for seconds in late.values()), late


def test_a_two_hour_backoff_and_three_hours_of_reservations_are_scheduled_not_held(
    start_worker, queues, store, prefix
):
    start_worker(
        JOB_MIN_BACKOFF_MS="7200000",  # the first backoff: 2 h x U[1, 2)
        JOB_MAX_BACKOFF_MS="14400000",
        RATE_LIMITS=json.dumps(
            {"smtp": {"rate": 1000, "burst": 1000}, "slowpoke": {"rate": "1/minute", "burst": 1}}
        ),
    )
    queue = queues.name(workload.flaky)
    failing = queues.send(workload.flaky, "r", 1)
    sent = send_bulk(
        [queues.message(workload.limited, f"l{i}", "slowpoke") for i in range(181)], broker=queues.broker
    )
    started = time.time()

    def scheduled() -> bool:
        count: int = queues._status().backend.scheduled([queue])[queue].count
        return count == 181

    wait_for(scheduled, timeout=90, what="the retry and 180 reservations scheduled")
    retry = queues.status(failing.message_id)
    assert retry.state == "scheduled" and retry.attempts == 1
    assert 7_200 - 5 <= retry.due_at / 1000 - started <= 14_400 + 5
    records = [queues.status(m.message_id) for m in sent]
    dues = sorted(r.due_at / 1000 - started for r in records if r and r.state == "scheduled")
    # One job ran on the burst; the others own a slot a minute apart, up to three hours ahead.
    assert len(store.lrange(f"test:{prefix}starts", 0, -1)) == 1
    assert len(dues) == 180 and dues[0] >= 60 - 5 and 180 * 60 - 65 <= dues[-1] <= 180 * 60 + 5
    assert sum(in_cascade(prefix).values()) == 181
    samples = []
    for _ in range(7):  # the management API refreshes its samples every 5 s
        samples.append(unacked(queues, queue))
        time.sleep(1)
    assert samples == [0] * 7
    health = requests.get(queues.api(f"/{queue}.DQ"), auth=queues.auth, timeout=10).json()
    assert health["messages"] == 0


def test_a_long_delay_left_in_a_delay_queue_by_plain_dramatiq_moves_into_the_cascade(
    start_worker, queues, prefix
):
    queue = queues.name(workload.record)
    queues.broker.declare_queue(queue, ensure=True)
    eta = int(time.time() * 1000) + 3_600_000
    # What a worker before the cascade finds: a message due in an hour in <queue>.DQ.
    message = queues.message(workload.record, "old").copy(queue_name=queue + ".DQ", options={"eta": eta})
    queues.publish_raw(message)
    start_worker()
    wait_for(lambda: in_cascade(prefix), timeout=30, what="the old delay in the cascade")
    (waiting,) = cascade_contents(queues)
    body = json.loads(waiting["payload"])
    assert (body["message_id"], body["options"]["eta"]) == (message.message_id, eta)
    assert queues.depth(queue + ".DQ") == 0
    # The management API's sample may predate the ack that followed the move's confirm.
    wait_for(lambda: unacked(queues, queue) == 0, timeout=20, what="the moved delivery acked")
    record = wait_for(lambda: queues.status(message.message_id), what="its status")
    assert (record.state, record.due_at) == ("scheduled", eta)


def test_a_publish_the_cascade_refuses_raises_at_send_and_holds_a_retry_until_taken(
    start_worker, queues, store, prefix
):
    queue = queues.name(workload.flaky)
    queues.broker.declare_queue(queue, ensure=True)  # the cascade with it
    worker = start_worker(JOB_MIN_BACKOFF_MS="100000", JOB_MAX_BACKOFF_MS="100000")  # 100 s
    with refusing_cascade(queues):
        with pytest.raises(ConnectionClosed):
            send_delayed(queues, workload.record, 60_000, "refused")
        failing = queues.send(workload.flaky, "n1", 1)
        wait_for(lambda: "retry_publish_failed" in worker.output(), timeout=60, what="a refused retry")
        assert in_cascade(prefix) == {}
    # The held delivery comes back and its decided retry goes into the cascade: nothing lost.
    wait_for(lambda: in_cascade(prefix), timeout=90, what="the retry in the cascade")
    record = wait_for(
        lambda: (r := queues.status(failing.message_id)) and r.state == "scheduled" and r, what="scheduled"
    )
    assert 50 - 5 <= record.due_at / 1000 - time.time() <= 100
    assert store.llen(f"test:{prefix}attempt:n1") == 1  # not run again while held


def test_a_retry_delay_past_the_cascade_dead_letters_its_job_once(start_worker, queues, store, prefix):
    # It used to be held for redelivery and refused at each one, for ever, an ERROR every 30 s.
    worker = start_worker()
    queue = queues.name(workload.retry_in)
    sent = queues.send(workload.retry_in, "far", MAX_DELAY_MS + 1)
    wait_for(lambda: queues.depth(queue + ".DLQ") == 1, timeout=60, what="its dead letter")
    (letter,) = queues.peek(queue + ".DLQ")
    headers = letter["properties"]["headers"]
    assert letter["properties"]["message_id"] == sent.message_id
    assert (headers["x-dl-reason"], headers["x-dl-exception"]) == ("rejected", "DelayOutOfRange")
    assert "at most" in headers["x-dl-error"]
    wait_for(lambda: unacked(queues, queue) == 0, timeout=20, what="the delivery acked")
    assert store.llen(f"test:{prefix}ran:far") == 1 and in_cascade(prefix) == {}
    assert queues.depth(queue) == 0 and "follow_up_publish_refused" not in worker.output()
