"""With the state store down, the store's address must not reach Sentry from the ``check_health``
job through the SDK's logging integration (on in every worker, as ``configure_sentry`` starts it):
``alert``'s ERROR line is an event of its own and its WARNING lines breadcrumbs of the next event,
so they name a dependency by its error's class only; the error's text is a DEBUG line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import sentry_sdk
import structlog

from jobsystem.observability.logs import configure_logging
from jobsystem.observability.sentry import configure_sentry
from jobsystem.ops import alerts, health
from jobsystem.ops.queue_counts import AmqpCounts, QueueCounts
from jobsystem.settings import load_settings
from tests.servers import sentry_events, sentry_server
from tests.unit.test_health_outages import HOST, PORT, FailingStore


def test_an_alert_with_the_state_store_down_sends_sentry_no_store_address(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, logging_restored: None
) -> None:
    counted = {"q": QueueCounts(waiting=0, consumers=1, delayed=0, delay_consumers=1, dead=0)}
    monkeypatch.setattr(health, "count_queues", lambda *_a, **_kw: AmqpCounts(counted, "delay.unroutable", 0))
    monkeypatch.setattr(health, "queue_stats", lambda *_a, **_kw: {})
    store = FailingStore(tmp_path / "state.db")
    with sentry_server() as (dsn, envelopes):
        settings = load_settings({"SENTRY_DSN": dsn, "LOG_LEVEL": "INFO"})
        configure_logging(settings)
        configure_sentry(settings)  # as build_system does in every worker
        try:
            monkeypatch.setattr(alerts, "logger", structlog.get_logger(alerts.__name__))  # not a cached one
            report = health.check(["q"], config=settings, state=store, timeout=3)
            assert alerts.alert(report, state=store, settings=settings) == ["state_store"]
            structlog.get_logger("billing").error("payment_failed")  # any later error of the worker
            sentry_sdk.flush(5)
        finally:
            sentry_sdk.get_client().close()
            sentry_sdk.get_global_scope().set_client(None)
        events = sentry_events(list(envelopes))
    assert any("payment_failed" in json.dumps(event) for event in events), events
    # What carries the address: (whether it is the event's own line, not a breadcrumb, the line's event).
    carriers = [
        (event.get("logentry", {}).get("message") == text, _event_name(text))
        for event in events
        for text in [event.get("logentry", {}).get("message") or ""]
        + [crumb.get("message") or "" for crumb in event.get("breadcrumbs", {}).get("values", [])]
        if f"{HOST}:{PORT}" in text
    ]
    assert carriers == [], carriers


def _event_name(text: str) -> str:
    found = re.search(r"'event': '([^']+)'", text)
    return found[1] if found else text[:40]
