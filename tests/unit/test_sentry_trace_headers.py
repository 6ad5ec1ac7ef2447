"""The trace headers Sentry's SDK adds to what the process sends: none to other hosts' HTTP
servers, and a message's without the DSN's key, its error still joining the sender's trace."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import dramatiq
import pytest
import sentry_sdk
import sentry_sdk.integrations.dramatiq as sentry_dramatiq
from dramatiq.brokers.stub import StubBroker
from sentry_sdk.tracing_utils import should_propagate_trace

from jobsystem.observability.sentry_headers import without_dsn
from tests.sentry_memory import DSN_KEY, sentry_capture, settle, work_off
from tests.servers import recording_server

HEADERS = sentry_dramatiq.SentryMiddleware.SENTRY_HEADERS_NAME


def test_an_outgoing_http_request_carries_no_part_of_the_dsn(
    monkeypatch: pytest.MonkeyPatch, logging_restored: None
) -> None:
    """Trace propagation went to every host: each request an actor or the management client made
    carried ``baggage`` with ``sentry-public_key``, the DSN's key."""
    with (
        recording_server() as (url, received),
        sentry_capture(monkeypatch),
        urllib.request.urlopen(url, timeout=5) as answer,
    ):
        assert answer.status == 204
    (headers,) = received
    assert DSN_KEY not in json.dumps(headers), headers


def test_no_http_client_integration_would_add_trace_headers(
    monkeypatch: pytest.MonkeyPatch, logging_restored: None
) -> None:
    """The stdlib integration is off, so the test above cannot see this: any HTTP integration
    (httpx, aiohttp, stdlib) asks ``should_propagate_trace`` first; no host is a target."""
    with sentry_capture(monkeypatch):
        client = sentry_sdk.get_client()
        for url in ("https://api.example.com/customers", "http://127.0.0.1:15672/api/queues"):
            assert not should_propagate_trace(client, url), url


def test_a_sent_message_carries_no_part_of_the_dsn(
    monkeypatch: pytest.MonkeyPatch, logging_restored: None
) -> None:
    """The integration writes ``_sentry_headers`` into every message's options, where RabbitMQ,
    dead letters, exports and ``jobctl dlq show`` keep them: its baggage named the DSN's key."""
    with sentry_capture(monkeypatch):
        broker = StubBroker()
        actor = dramatiq.actor(broker=broker, queue_name="egress")(settle)
        actor.send(1)
    body = broker.queues["egress"].get_nowait()
    assert DSN_KEY not in body.decode(), body
    assert json.loads(body)["options"][HEADERS]["sentry-trace"]  # the trace id still goes


def test_a_failed_jobs_event_joins_the_senders_trace_without_the_key(
    monkeypatch: pytest.MonkeyPatch, logging_restored: None
) -> None:
    with sentry_capture(monkeypatch) as events:
        broker = StubBroker()
        actor = dramatiq.actor(broker=broker, queue_name="egress", max_retries=0)(settle)
        with sentry_sdk.isolation_scope() as scope:  # a trace of the sender's own, not the worker's
            scope.set_new_propagation_context()
            message = actor.send(1)
        work_off(broker, "egress")
    headers = message.options[HEADERS]
    assert "sentry-public_key" not in headers["baggage"] and "sentry-trace_id" in headers["baggage"]
    (failed,) = [event for event in events if event.get("exception")]
    assert failed["contexts"]["trace"]["trace_id"] == headers["sentry-trace"].split("-")[0], failed


def test_trace_headers_of_a_shape_not_understood_are_dropped_whole(
    monkeypatch: pytest.MonkeyPatch, logging_restored: None
) -> None:
    with sentry_capture(monkeypatch):
        monkeypatch.setattr(sentry_dramatiq, "get_baggage", lambda: {"sentry-public_key": DSN_KEY})
        broker = StubBroker()
        message: Any = dramatiq.actor(broker=broker, queue_name="egress")(settle).send(1)
    assert HEADERS not in message.options and DSN_KEY not in broker.queues["egress"].get_nowait().decode()


@pytest.mark.parametrize(
    ("baggage", "kept"),
    [
        (
            f"sentry-trace_id=ab12,sentry-public_key={DSN_KEY},sentry-org_id=7,vendor=x",
            "sentry-trace_id=ab12,vendor=x",
        ),
        (f"sentry-public_key={DSN_KEY}", None),
        (None, None),
    ],
)
def test_the_dsns_members_leave_the_baggage_and_the_rest_stays(baggage: str | None, kept: str | None) -> None:
    assert without_dsn(baggage) == kept
