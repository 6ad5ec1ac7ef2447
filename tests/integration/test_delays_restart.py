"""Long delays survive a RabbitMQ restart: a job delayed an hour and one delayed thirty days are
scheduled (status and health), still in the delay cascade with their due times after
``rabbitmqctl stop_app && start_app``, and not run early.

This module restarts the shared RabbitMQ: every other test running at the same time sees its
connections closed. Run it on its own (``pytest tests/integration/test_delays_restart.py``).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import dramatiq
import pytest

from jobsystem.rabbitmq.delays import LEVELS, cascade_seconds
from jobsystem.system import get_system
from tests import workload
from tests.delay_support import cascade_contents, in_cascade, send_delayed, short_horizon
from tests.support import BIN, ROOT, wait_for, worker_env

#: ``rabbitmqctl stop_app`` drops every client's connection: this module runs alone.
pytestmark = pytest.mark.exclusive

HOUR_MS, MONTH_MS = 3_600_000, 30 * 86_400_000


def restart_rabbitmq(*brokers: dramatiq.Broker) -> None:
    """Restart RabbitMQ, then drop ``brokers``' connections of this thread: the restart closed
    them, and the tests after this one (sharing the process's brokers) would find them closed."""
    for command in (["stop_app"], ["start_app"], ["await_startup"]):
        subprocess.run(["rabbitmqctl", *command], check=True, capture_output=True, timeout=180)
    for broker in brokers:
        del broker.connection  # type: ignore[attr-defined]  # the next use connects afresh


def jobctl(prefix: str, tmp_path: Path, *args: str) -> tuple[int, str]:
    result = subprocess.run(
        [str(BIN / "jobctl"), *args],
        env=worker_env(prefix, tmp_path),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result.returncode, result.stdout


def first_level(seconds: int) -> str:
    """The level queue a message carrying ``seconds`` enters first: its highest set bit."""
    return f"delay.L{seconds.bit_length() - 1}"


def test_an_hour_and_a_month_are_scheduled_survive_a_restart_and_do_not_run_early(
    start_worker, queues, store, prefix, tmp_path
):
    worker = start_worker()
    hour = send_delayed(queues, workload.slow, HOUR_MS, "hour", 0)
    month = send_delayed(queues, workload.slow, MONTH_MS, "month", 0)
    sent = {hour.message_id: (hour, HOUR_MS), month.message_id: (month, MONTH_MS)}
    wait_for(lambda: all(queues.status(m) for m in sent), what="status records")
    expected_levels = {prefix + first_level(cascade_seconds(ms)): 1 for _, ms in sent.values()}
    assert in_cascade(prefix) == expected_levels

    restart_rabbitmq(get_system().broker, queues.broker)

    # Still waiting where they were, carrying their seconds and their due times.
    assert wait_for(lambda: in_cascade(prefix), timeout=60, what="the cascade back") == expected_levels
    for waiting in wait_for(lambda: cascade_contents(queues), timeout=30, what="the management API"):
        body = json.loads(waiting["payload"])
        message, delay_ms = sent[body["message_id"]]
        assert body["options"]["eta"] == message.options["eta"]
        assert (
            waiting["seconds"] == cascade_seconds(delay_ms)
            and len(waiting["routing_key"].split(".")) > LEVELS
        )
        record = queues.status(message.message_id)
        assert (record.state, record.due_at) == ("scheduled", message.options["eta"])
        code, out = jobctl(prefix, tmp_path, "status", message.message_id)
        assert code == 0 and "scheduled, due " in out, out
    code, out = jobctl(prefix, tmp_path, "health", "--queue", "workload", "--json")
    (health,) = json.loads(out)["queues"]
    assert (health["scheduled"], health["next_due_at"]) == (2, hour.options["eta"])

    # The worker is back on its queue (a short delay runs through the cascade after the restart)
    # and has run neither long one.
    probe = send_delayed(short_horizon(queues, prefix), workload.slow, 4_000, "probe", 0)
    assert queues.wait_finished([probe], timeout=60)[probe.message_id].state == "succeeded"
    assert store.llen(f"test:{prefix}started:hour") == 0 and store.llen(f"test:{prefix}started:month") == 0
    assert in_cascade(prefix) == expected_levels
    assert {queues.status(m).state for m in sent} == {"scheduled"}
    assert worker.proc.poll() is None
