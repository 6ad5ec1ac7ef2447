"""Every Sentry client the project starts has the same options: the scrubber on its events, no host
name, only the integrations it lists (the worker's and dashboard's, the scheduler's check-ins, the
health alerts' client of its own)."""

from __future__ import annotations

import json
import platform
import socket

import pytest
import sentry_sdk

from jobsystem.observability.sentry import UNNAMED_SERVER
from jobsystem.ops import alerts
from jobsystem.settings import load_settings
from scheduler.checkins import sentry_checkins
from tests.sentry_memory import DSN, memory_sentry, sentry_capture, sentry_settings
from tests.servers import sentry_events, sentry_server

EMAIL = "ana.lopez@example.com"
#: The host's name as the tests make ``socket.gethostname`` answer: telling, and found nowhere else.
HOST = "db-host-7f3a9c.corp.example"
#: The integrations a process with ``SENTRY_DSN`` runs: the SDK's defaults but stdlib (URLs, query
#: strings and command lines as breadcrumbs), and the two the project lists. None auto-enabled.
INTEGRATIONS = {"argv", "atexit", "dedupe", "excepthook", "logging", "modules", "threading"}
INTEGRATIONS |= {"dramatiq", "starlette"}


def test_only_the_listed_integrations_are_on(monkeypatch: pytest.MonkeyPatch, logging_restored: None) -> None:
    """Auto-enabled ones started with what was installed: Redis made a breadcrumb of every
    command with its key (a searched idempotency key), and httpx, SQLAlchemy or pymongo would.
    An earlier client of the process (a library's, a user's) with every integration set up
    first: the SDK's ``disabled_integrations`` would not stop them for the project's client."""
    with memory_sentry(monkeypatch):
        sentry_sdk.init(dsn=DSN)  # the SDK's defaults and every integration it finds
    with sentry_capture(monkeypatch):
        assert set(sentry_sdk.get_client().integrations) == INTEGRATIONS


@pytest.mark.parametrize(
    ("configured", "sent"), [({}, UNNAMED_SERVER), ({"SENTRY_SERVER_NAME": "eu-1"}, "eu-1")]
)
def test_events_name_no_host_unless_told(
    configured: dict[str, str], sent: str, monkeypatch: pytest.MonkeyPatch, logging_restored: None
) -> None:
    """The SDK's ``server_name`` was the host's name; the Python version still goes (the stdlib
    integration, now off, added it)."""
    monkeypatch.setattr(socket, "gethostname", lambda: HOST)
    with sentry_capture(monkeypatch, **configured) as events:
        sentry_sdk.capture_message("checked")
    (event,) = events
    assert event["server_name"] == sent and HOST not in json.dumps(event), event
    assert event["contexts"]["runtime"]["version"] == platform.python_version()


def test_the_schedulers_checkins_start_sentry_with_the_scrubber(monkeypatch: pytest.MonkeyPatch) -> None:
    """With nothing else started, the check-ins' own ``sentry_sdk.init`` had no ``before_send``."""
    assert not sentry_sdk.is_initialized()
    monkeypatch.setattr(socket, "gethostname", lambda: HOST)
    with memory_sentry(monkeypatch) as events:
        assert sentry_checkins(sentry_settings(), []) is not None
        sentry_sdk.capture_message(f"schedule failed for {EMAIL}")
    (event,) = events
    sent = json.dumps(event)
    assert EMAIL not in sent and "[email]" in sent and HOST not in sent, event


def test_a_health_alert_is_scrubbed_and_names_no_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """The alerts' client of its own had no ``before_send`` and the SDK's ``server_name``."""
    monkeypatch.setattr(alerts, "_clients", {}, raising=False)  # a client of this test's DSN
    monkeypatch.setattr(socket, "gethostname", lambda: HOST)
    with sentry_server() as (dsn, envelopes):
        settings = load_settings({"SENTRY_DSN": dsn})
        alerts._send_to_sentry(settings, "backlog:q", "q", "backlog", f"waiting since {EMAIL} wrote")
        for client in alerts._clients.values():  # this test's: its transport's thread ends
            client.close()
        (event,) = sentry_events(list(envelopes))
    sent = json.dumps(event)
    assert "backlog:q" in sent and EMAIL not in sent and HOST not in sent, event
    assert event["server_name"] == UNNAMED_SERVER
