"""``jobctl health`` on real queues: a backed-up queue is degraded, a served one healthy, an
unreachable broker exits 2, without the management API the AMQP counts still judge, and a
dependency that hangs costs the check its timeout, not more."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from functools import partial
from pathlib import Path
from urllib.parse import quote

import pika
import pytest
import requests

from jobsystem.ops import queue_counts
from jobsystem.ops.health import check, measure
from jobsystem.settings import load_settings
from jobsystem.store import open_store
from jobsystem.store.redis import RedisStore
from tests import workload
from tests.amqp_server import fake_rabbitmq, silenceable_path
from tests.delay_support import send_delayed, short_horizon
from tests.jobctl_run import jobctl
from tests.servers import free_port, silent_server
from tests.support import BIN, ROOT, TEST_REDIS_URL, finished_within, wait_for, worker_env


def jobctl_health(prefix: str, tmp_path: Path, *args: str, **env: str) -> tuple[int, str]:
    result = subprocess.run(
        [str(BIN / "jobctl"), "health", "--queue", "workload", *args],
        env=worker_env(prefix, tmp_path, **env),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return result.returncode, result.stdout


def test_backed_up_queue_is_degraded_then_healthy_once_served(start_worker, queues, prefix, tmp_path):
    sent = [queues.send(workload.record, f"h{i}") for i in range(10)]
    time.sleep(1.2)  # the oldest message is now older than HEALTH_MAX_AGE_MS
    code, out = jobctl_health(prefix, tmp_path, "--json", HEALTH_MAX_WAITING="5", HEALTH_MAX_AGE_MS="1000")
    assert code == 1, out
    report = json.loads(out)
    (queue,) = report["queues"]
    assert (report["status"], report["source"], queue["queue"]) == (
        "degraded",
        "management",
        f"{prefix}workload",
    )
    assert (queue["waiting"], queue["consumers"], queue["verdict"]) == (10, 0, "degraded")
    assert queue["oldest_age_s"] >= 1.0
    assert {p["kind"] for p in queue["problems"]} == {"backlog", "oldest_age", "no_consumers"}

    # Without the management API the AMQP counts still show the backlog.
    code, out = jobctl_health(
        prefix,
        tmp_path,
        "--json",
        HEALTH_MAX_WAITING="5",
        RABBITMQ_MANAGEMENT_URL=f"http://127.0.0.1:{free_port()}",
    )
    report = json.loads(out)
    assert (code, report["source"], report["queues"][0]["waiting"]) == (1, "amqp", 10)
    assert report["queues"][0]["unjudged"] == ["oldest_age"]  # no age: an alert on it stays open
    assert {p["kind"] for p in report["queues"][0]["problems"]} == {"backlog", "no_consumers"}

    start_worker()
    sent.append(queues.send(workload.permanent, "dead-one"))
    finished = queues.wait_finished(sent)
    assert sorted(r.state for r in finished.values()) == ["dead"] + ["succeeded"] * 10
    assert queues.depth(f"{prefix}workload.DLQ") == 1
    code, out = jobctl_health(prefix, tmp_path)
    assert code == 0, out
    assert out.splitlines()[1].split()[:2] == [f"{prefix}workload", "healthy"]
    assert "healthy" in out.splitlines()[-1]
    # A dead letter over the threshold degrades it; totals come from the job-status counters.
    code, out = jobctl_health(prefix, tmp_path, "--json", HEALTH_MAX_DEAD_LETTERS="0")
    (queue,) = json.loads(out)["queues"]
    assert code == 1 and [p["kind"] for p in queue["problems"]] == ["dead_letters"]
    assert (queue["dead"], queue["consumers"] >= 1) == (1, True)
    assert (queue["succeeded"], queue["failed"]) == (10, 1)


def test_unreachable_broker_exits_2(prefix, tmp_path):
    code, out = jobctl_health(
        prefix, tmp_path, RABBITMQ_URL=f"amqp://guest:guest@127.0.0.1:{free_port()}/%2F"
    )
    assert code == 2 and out.startswith("unreachable"), out
    code, out = jobctl_health(
        prefix, tmp_path, "--json", RABBITMQ_URL=f"amqp://guest:guest@127.0.0.1:{free_port()}/"
    )
    assert code == 2 and json.loads(out)["status"] == "unreachable"


def test_jobctl_health_with_a_queue_named_waits_its_timeout_in_all(prefix, tmp_path):
    """The check that a --queue exists comes first: with a timeout of its own, a RabbitMQ that
    answers the handshake and then nothing cost the timeout twice. One deadline serves both."""
    with fake_rabbitmq() as rabbit:
        started = time.monotonic()
        code, out = jobctl_health(
            prefix,
            tmp_path,
            "--timeout",
            "5",
            RABBITMQ_URL=rabbit.url(),
            RABBITMQ_MANAGEMENT_URL=f"http://127.0.0.1:{free_port()}",
        )
        took = time.monotonic() - started
    assert code == 2 and out.startswith("unreachable"), out
    # The timeout, plus the command's start (under 1 s when idle, allowed 3.5 s on a loaded
    # machine); twice the timeout would be 10 s and more.
    assert took < 8.5, took


def test_a_message_ready_just_now_is_young_whatever_its_timestamps_and_size(queues):
    """A delayed job or a retry is published into its queue again when due: its age counts from
    then, not from its send or its failed attempt (``message_timestamp``, ``requeue_timestamp``), and
    is read from its AMQP timestamp even when its body is larger than the peek shows."""
    queue = queues.name(workload.record)
    hour_ago = int(time.time() * 1000) - 3_600_000
    # What a worker publishes when a retry's backoff or a job's delay is over.
    released = queues.message(workload.record, "late").copy(
        message_timestamp=hour_ago, options={"retries": 1, "requeue_timestamp": hour_ago + 1_000}
    )
    queues.broker.enqueue(released)
    ((health,), source, _) = measure(queues.settings, [queue])
    assert source == "management" and health.waiting == 1
    assert health.oldest_age_s is not None and health.oldest_age_s < 60, health.oldest_age_s

    requests.delete(queues.api(f"/{quote(queue, safe='')}/contents"), auth=queues.auth, timeout=10)
    queues.broker.enqueue(queues.message(workload.record, "x" * 100_000))  # past the peek's 64 KiB
    ((health,), _, notes) = measure(queues.settings, [queue])
    assert health.oldest_age_s is not None and health.oldest_age_s < 60, notes


def test_a_hanging_management_api_and_state_store_cost_the_timeout_not_more(queues, prefix):
    """Asked in series, a management API and a state store that accept and never answer cost
    their timeouts one after the other (here 2 s, then the store's 5 s): past a Prometheus scrape's
    10 s with the defaults. Asked at once under one deadline, the report comes within the check's
    timeout, names both, and keeps RabbitMQ's exact counts."""
    queue = queues.name(workload.record)
    queues.send(workload.record, "waiting")
    with silent_server() as port:
        settings = load_settings(
            {
                **os.environ,
                "QUEUE_PREFIX": prefix,
                "STATE_URL": TEST_REDIS_URL,
                "RABBITMQ_MANAGEMENT_URL": f"http://127.0.0.1:{port}",
            }
        )
        hanging = RedisStore(f"redis://127.0.0.1:{port}/0", socket_timeout=5)
        report = finished_within(3.5, lambda: check([queue], config=settings, state=hanging, timeout=2))
    assert (report.status, report.source) == ("degraded", "amqp")
    assert [p.kind for p in report.problems] == ["state_store"]
    # Whichever comes first: its own timeout (ReadTimeout) or the check's deadline, both 2 s.
    assert any(note.startswith("management API unreachable (") for note in report.notes), report.notes
    (health,) = report.queues
    assert (health.waiting, health.consumers, health.unjudged) == (1, 0, ["oldest_age"])


def test_jobs_delayed_or_scheduled_for_a_queue_nobody_consumes_are_reported(queues, prefix):
    """Nothing waits in the work queue itself, but a retry's backoff or a short delay waits in its
    delay queue and longer ones in the delay cascade: with no worker, none of them will run. The
    one due within the check's delay horizon (30 s) counts; the one due in an hour not yet."""
    sender = short_horizon(queues, prefix)  # delays past 2 s go into the cascade
    send_delayed(sender, workload.record, 1_500, "soon")  # into <queue>.DQ
    scheduled = [
        send_delayed(sender, workload.record, delay, "later")  # into the cascade
        for delay in (20_000, 3_600_000)
    ]
    for message in scheduled:
        wait_for(partial(sender.status, message.message_id), what="the scheduled record")
    settings = load_settings({**os.environ, "QUEUE_PREFIX": prefix, "STATE_URL": TEST_REDIS_URL})
    state = open_store(settings.state_url, namespace=settings.state_namespace)
    report = check([queues.name(workload.record)], config=settings, state=state)
    (health,) = report.queues
    assert (health.waiting, health.delayed, health.scheduled, health.consumers) == (0, 1, 2, 0)
    assert (report.status, [(p.kind, p.detail) for p in health.problems]) == (
        "degraded",
        [("no_consumers", "no consumers, 1 delayed, 1 scheduled due soon")],
    )


def test_a_path_to_rabbitmq_gone_silent_after_the_handshake_ends_the_counts_at_the_deadline(
    queues, prefix, monkeypatch
):
    """Past the handshake pika waits for each answer with no timeout but the heartbeat's (none
    with RABBITMQ_HEARTBEAT=0): each scrape, dashboard sample and check_health run would leave one
    more thread and socket behind. The report comes at the deadline, and the counting thread ends
    then, its socket closed; so does jobctl's check that a --queue exists."""
    node = queues.broker.parameters
    node = node[0] if isinstance(node, list) else node
    connect, counting = queue_counts._connect, []

    def then_silent(*args):
        connection = connect(*args)
        counting.append(threading.current_thread())
        path.silent.set()
        return connection

    monkeypatch.setattr(queue_counts, "_connect", then_silent)
    with silenceable_path(node.host, node.port) as path:
        settings = load_settings(
            {
                **os.environ,
                "QUEUE_PREFIX": prefix,
                "RABBITMQ_URL": f"amqp://guest:guest@127.0.0.1:{path.port}/%2F",
                "RABBITMQ_HEARTBEAT": "0",
            }
        )
        state = RedisStore(TEST_REDIS_URL)
        report = finished_within(3.5, lambda: check(["q"], config=settings, state=state, timeout=2))
        assert report.status == "unreachable", report.error
        (thread,) = counting
        thread.join(1.5)
        assert not thread.is_alive(), "the counting thread still waits"
        assert path.closed.wait(1.0), "the connection was left open"

        path.silent.clear()
        path.closed.clear()
        with pytest.raises(ConnectionError, match="StreamLostError"):
            finished_within(3.5, lambda: queue_counts.missing_queues(settings, ["q"], 2))
        assert len(counting) == 2 and path.closed.wait(1.0), "the connection was left open"


def test_a_quorum_queue_named_is_counted_but_never_peeked(queues, prefix):
    """``jobctl health --queue`` reads any queue named, another application's too. A peek at a
    head (a get, then a requeue) counts as a delivery of a quorum queue's: with its delivery
    limit, a few checks would dead-letter or drop the message. It is counted, not peeked."""
    quorum = prefix + "quorum"
    arguments = {"x-queue-type": "quorum", "x-delivery-limit": 1}
    queues.broker.channel.queue_declare(quorum, durable=True, arguments=arguments)
    properties = pika.BasicProperties(delivery_mode=2, message_id="theirs")
    queues.broker.channel.basic_publish("", quorum, b"their job", properties)

    checks = [jobctl(prefix, "health", "--queue", "quorum", "--json", check=False) for _ in range(3)]

    held = queues.peek(quorum)  # this peek is the message's first delivery
    assert len(held) == 1, "the checks' peeks delivered their message past its limit: dropped"
    (head,) = held
    assert (head["properties"]["message_id"], head["properties"]["headers"]) == (
        "theirs",
        {"x-delivery-count": 0},
    )
    report = json.loads(checks[-1].stdout)
    (queue,) = report["queues"]
    assert (queue["waiting"], queue["oldest_age_s"], queue["unjudged"]) == (1, None, ["oldest_age"])
    assert f"{quorum}: a quorum queue, not peeked (each peek would count as a delivery)" in report["notes"]
