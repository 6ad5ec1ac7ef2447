"""Review of fix/sentryaddr: lines Sentry takes (INFO and WARNING as breadcrumbs, ERROR as events)
must not name a dependency's address; the fix's rule, "the store named by its setting and kind,
not its label (its address)", was applied to the outage lines only. A worker's boot line, a bulk
send's failover line, the scheduler's and the dashboard's start lines still handed Sentry the
Redis URL, RabbitMQ's host and port or the dashboard's own. The addresses are at DEBUG now (in
``<event>_addresses``, or a failure's ``<event>_cause``), which Sentry never takes."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import structlog
from dramatiq.brokers.rabbitmq import RabbitmqBroker

import dashboard.server
import scheduler.service
from jobsystem.rabbitmq.bulk import send_bulk
from jobsystem.settings import load_settings
from middleware.store_check import StoreCheck
from scheduler.service import Scheduler
from tests.amqp_server import fake_rabbitmq
from tests.servers import free_port, sent_to_sentry
from tests.support import fresh_store
from tests.unit.test_bulk import Recorder, messages


def _line(log: str, event: str) -> dict[str, Any]:
    """The log's one JSON line of ``event``."""
    lines: list[dict[str, Any]] = [
        found
        for found in (json.loads(text) for text in log.splitlines() if text.startswith("{"))
        if found.get("event") == event
    ]
    (line,) = lines
    return line


def test_a_worker_booting_on_redis_sends_sentry_no_store_address(
    tmp_path: Path, logging_restored: None
) -> None:
    with fresh_store("redis", tmp_path) as store:
        assert "://" in store.label and ":6379" in store.label  # redis://<host>:<port>/<db>
        check = StoreCheck(store, setting="STATE_URL")
        sent, log = sent_to_sentry(lambda: check.after_process_boot(None), log_level="DEBUG")  # type: ignore[arg-type]
    assert "state_store_ready" in sent  # the breadcrumb went
    assert store.label not in sent, sent
    ready = _line(log, "state_store_ready")
    assert (ready["level"], ready["setting"], ready["kind"], "store" in ready) == (
        "info",
        "STATE_URL",
        "redis",
        False,
    )
    assert _line(log, "state_store_ready_addresses")["store"] == store.label  # at DEBUG


def test_a_bulk_send_passing_over_a_node_sends_sentry_no_node_address(
    monkeypatch: pytest.MonkeyPatch, logging_restored: None
) -> None:
    refused = f"localhost:{free_port()}"  # nothing listens there: refused at once
    batch = messages(2)

    def failover() -> None:
        with fake_rabbitmq() as rabbit:
            url = f"amqp://guest:guest@{refused}/%2F?connection_attempts=1"
            broker = RabbitmqBroker(url=[url, rabbit.url()], middleware=[Recorder()])
            monkeypatch.setattr(broker, "declare_queue", lambda queue_name, ensure=False: None)
            assert send_bulk(batch, broker=broker, timeout=5) == batch  # all sent on the second node
            assert rabbit.published == [m.message_id for m in batch]

    sent, log = sent_to_sentry(failover, log_level="DEBUG")
    assert "bulk_send_node_unreachable" in sent  # the breadcrumb went
    assert refused not in sent, sent
    passed_over = _line(log, "bulk_send_node_unreachable")
    assert (passed_over["level"], passed_over["node"], passed_over["nodes"]) == ("warning", 1, 2)
    assert passed_over["error"].startswith("AMQP")  # pika's error, by its class
    cause = _line(log, "bulk_send_node_unreachable_cause")  # at DEBUG: the address and pika's text
    assert (cause["level"], cause["node"], f"{cause['host']}:{cause['port']}") == ("debug", 1, refused)
    assert cause["error"].startswith("connection failed: ")


def test_a_scheduler_starting_sends_sentry_no_store_address(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, logging_restored: None
) -> None:
    with fresh_store("redis", tmp_path) as store:

        def start() -> None:
            # A fresh logger: the module's may be cached with another test's configuration.
            monkeypatch.setattr(scheduler.service, "logger", structlog.get_logger("scheduler"))
            sched = Scheduler([], broker=SimpleNamespace(), store=store, settings=load_settings({}))  # type: ignore[arg-type]
            sched._stop.set()  # asked to stop before it started: run() starts, then stops
            sched.run()

        sent, log = sent_to_sentry(start, log_level="DEBUG")
    assert "scheduler_started" in sent  # the breadcrumb went
    assert store.label not in sent, sent
    started = _line(log, "scheduler_started")
    assert (started["level"], started["store"], started["kind"]) == ("info", "STATE_URL", "redis")
    assert _line(log, "scheduler_started_addresses")["store"] == store.label  # at DEBUG


def test_a_dashboard_starting_sends_sentry_no_address(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, logging_restored: None
) -> None:
    """Its own listening address included: jobctl echoes it to the terminal, no log line."""
    settings = load_settings(
        {
            "RABBITMQ_URL": "amqp://guest:guest@10.9.8.7:5672/%2F",
            "RABBITMQ_MANAGEMENT_URL": "http://10.9.8.6:15672",
            "DASHBOARD_ADMIN_PASSWORD": "an-admin-password-long-enough",
        }
    )
    served: list[socket.socket] = []
    monkeypatch.setattr(
        dashboard.server,
        "HealthSampler",
        lambda project: SimpleNamespace(start=lambda: None, stop=lambda: None),
    )
    monkeypatch.setattr(dashboard.server, "create_app", lambda *args: None)
    monkeypatch.setattr(dashboard.server, "run_uvicorn", lambda app, listener: served.append(listener))
    listener = socket.socket()  # unbound: the address the operator gave is the log's to hide
    with fresh_store("redis", tmp_path) as store:
        project = SimpleNamespace(settings=settings, store=store)
        sent, log = sent_to_sentry(
            lambda: dashboard.server.serve(project, listener, "10.9.8.5", 8181),  # type: ignore[arg-type]
            log_level="DEBUG",
        )
    assert served == [listener]
    assert "dashboard_started" in sent  # the breadcrumb went
    assert "10.9.8." not in sent and store.label not in sent, sent
    started = _line(log, "dashboard_started")
    assert (started["level"], started["store"], started["kind"]) == ("info", "STATE_URL", "redis")
    addresses = _line(log, "dashboard_started_addresses")  # at DEBUG
    assert addresses["url"] == "http://10.9.8.5:8181/" and "10.9.8.7" in addresses["rabbitmq"]
    assert "10.9.8.6" in addresses["management"] and addresses["state"] == store.label


def test_sent_to_sentry_leaves_no_breadcrumb_for_the_next_test(logging_restored: None) -> None:
    """The helper's own clean-up: a breadcrumb of one call must not ride on a later call's events."""
    import logging

    sent_to_sentry(lambda: logging.getLogger("tests").info("breadcrumb_of_an_earlier_test"))
    later, _ = sent_to_sentry(lambda: None)
    assert "later_error" in later and "breadcrumb_of_an_earlier_test" not in later, later
