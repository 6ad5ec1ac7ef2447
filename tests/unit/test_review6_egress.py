"""Review 6 (what leaves the process): leaks reproduced with a real Sentry client, each a strict xfail.

Sentry is set up as in every process with ``SENTRY_DSN`` (``configure_logging`` then
``configure_sentry``), its envelopes kept in memory by a transport of the test's own. Each test
fails today because of the leak it names and passes once it is fixed (then drop its xfail).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import socket
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import dramatiq
import pytest
import sentry_sdk
import uvicorn
from dramatiq.brokers.stub import StubBroker
from sentry_sdk.envelope import Envelope
from sentry_sdk.transport import Transport

import dashboard.server
from jobsystem.observability.logs import configure_logging
from jobsystem.observability.sentry import configure_sentry
from jobsystem.settings import load_settings
from tests.asgi import call
from tests.servers import free_port, http_serving
from tests.support import fresh_store
from tests.unit.test_dashboard_app import dashboard as dashboard_app

#: The project's root: the working directory of its processes, so its modules (and a user's
#: actors module beside them) are the application's own code (``in_app``) to the SDK.
ROOT = Path(__file__).resolve().parents[2]
#: The key of the DSN the tests configure: the credential of ``SENTRY_DSN``.
DSN_KEY = "0123456789abcdef0123456789abcdef"
DSN = f"http://{DSN_KEY}@127.0.0.1:9/42"


class _Memory(Transport):
    """Keeps the events the SDK would send (after ``before_send``), as the JSON it would send."""

    def __init__(self, options: dict[str, Any], events: list[dict[str, Any]]) -> None:
        super().__init__(options)
        self.events = events

    def capture_envelope(self, envelope: Envelope) -> None:
        for item in envelope.items:
            if item.type == "event" and item.payload.json is not None:
                self.events.append(json.loads(json.dumps(item.payload.json, default=str)))


@contextlib.contextmanager
def sentry_capture(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """Logging and Sentry set up as a process with ``SENTRY_DSN`` has them; yields the events
    sent. The caller restores logging (``logging_restored``); the client and the breadcrumbs
    are dropped here, so none rides on a later test's events."""
    events: list[dict[str, Any]] = []
    real_init = sentry_sdk.init

    def init(*args: Any, **options: Any) -> Any:
        return real_init(*args, transport=_Memory(options, events), **options)

    monkeypatch.setattr(sentry_sdk, "init", init)
    settings = load_settings({"SENTRY_DSN": DSN, "LOG_FORMAT": "json", "LOG_LEVEL": "INFO"})
    logging.getLogger().addHandler(logging.StreamHandler(io.StringIO()))
    configure_logging(settings)
    configure_sentry(settings)
    try:
        yield events
        sentry_sdk.flush(5)
    finally:
        sentry_sdk.get_client().close()
        sentry_sdk.get_global_scope().set_client(None)
        for scope in (sentry_sdk.get_isolation_scope(), sentry_sdk.get_current_scope()):
            scope.clear_breadcrumbs()
        sentry_sdk.get_global_scope().clear_breadcrumbs()


def settle(account: Any) -> None:
    """An application's actor (module-level, as in a user's ``actors`` module) that fails."""
    raise RuntimeError("settlement failed")


@pytest.mark.xfail(
    strict=True,
    reason="leak: an in-app frame's locals keep a string without spaces and every dict key as they "
    "are, so a job's argument (a surname, a name as a dict key) reaches Sentry through the actor's "
    "own frame, while the integration's copy of the same arguments is removed outright",
)
@pytest.mark.parametrize("argument", ["Lopez", {"Ana Lopez": 3}], ids=["surname", "name-as-key"])
def test_a_failing_actor_sends_sentry_none_of_its_arguments(
    argument: Any, monkeypatch: pytest.MonkeyPatch, logging_restored: None
) -> None:
    monkeypatch.chdir(ROOT)
    with sentry_capture(monkeypatch) as events:
        broker = StubBroker()  # built after sentry_sdk.init: the integration's middleware is on it
        actor = dramatiq.actor(broker=broker, queue_name="review6", max_retries=0)(settle)
        actor.send(argument)
        worker = dramatiq.Worker(broker, worker_timeout=50)
        worker.start()
        try:
            broker.join("review6", fail_fast=False)
            worker.join()
        finally:
            worker.stop()
    frames = [
        frame
        for event in events
        for value in event.get("exception", {}).get("values", [])
        for frame in value.get("stacktrace", {}).get("frames", [])
        if frame.get("function") == "settle"
    ]
    assert frames and frames[0].get("in_app") is True, events  # the failure went, with the actor's frame
    assert "Lopez" not in json.dumps(events), frames[0].get("vars")


class _BrokenStatus:
    """The job status store failing as a bug would (not an outage): the page answers 500."""

    def __getattr__(self, name: str) -> Any:
        def fail(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("unexpected reply")

        return fail


@pytest.mark.xfail(
    strict=True,
    reason="leak: Sentry's ASGI middleware attaches the request's query string (and the Referer "
    "header, which quotes the previous page's) to a dashboard error's event: a search for an "
    "idempotency key (a customer's name) goes to Sentry, which the dashboard keeps out of its "
    "own logs (no access log, paths without query)",
)
@pytest.mark.parametrize(
    ("target", "headers"),
    [
        ("/jobs?q=invoice%20Ana%20Lopez", {}),
        ("/jobs/m1", {"Referer": "http://testserver/jobs?q=invoice%20Ana%20Lopez"}),
    ],
    ids=["query", "referer"],
)
def test_a_failing_dashboard_page_sends_sentry_no_search(
    target: str,
    headers: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    logging_restored: None,
) -> None:
    monkeypatch.chdir(ROOT)
    with fresh_store("sqlite", tmp_path) as store, sentry_capture(monkeypatch) as events:
        app, project, _ = dashboard_app(store)
        project.status = _BrokenStatus()
        answer = call(app, "GET", target, headers=headers)
    assert answer.status_code == 500, answer.text
    failed = [e for e in events if "dashboard_request_failed" in json.dumps(e)]
    assert failed, events  # the failure went to Sentry
    assert "Lopez" not in json.dumps(failed), failed[0].get("request")


@pytest.mark.xfail(
    strict=True,
    reason="leak: the SDK's Redis integration (auto-enabled) makes a breadcrumb of every Redis "
    "command with its key; the dashboard looks a search up as a message id, so the searched text "
    "(an idempotency key: a customer's name) is a key, and rides on the request's error event",
)
def test_a_dashboard_search_sends_sentry_no_store_key_holding_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, logging_restored: None
) -> None:
    monkeypatch.chdir(ROOT)
    with fresh_store("redis", tmp_path) as store, sentry_capture(monkeypatch) as events:
        app, project, _ = dashboard_app(store)
        project.idempotency = _BrokenStatus()  # after the status lookup (a Redis HGETALL): a 500
        answer = call(app, "GET", "/jobs?q=invoice%20Ana%20Lopez")
    assert answer.status_code == 500, answer.text
    (failed,) = [e for e in events if "dashboard_request_failed" in json.dumps(e)]
    crumbs = failed.get("breadcrumbs", {}).get("values", [])  # the request's, its Redis commands' included
    assert "Lopez" not in json.dumps(crumbs), [c for c in crumbs if "Lopez" in json.dumps(c)]


@contextlib.contextmanager
def _recording_server() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """An HTTP server (a webhook, an API an actor calls) recording each request's headers."""
    received: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            received.append(dict(self.headers.items()))
            self.send_response(204)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet."""

    with http_serving(Handler) as port:
        yield f"http://127.0.0.1:{port}/hook", received


@pytest.mark.xfail(
    strict=True,
    reason="leak: trace propagation is on for every host (trace_propagation_targets defaults to all): "
    "each outgoing HTTP request carries a baggage header with sentry-public_key, SENTRY_DSN's key, "
    "to whatever server an actor or the management client calls",
)
def test_an_outgoing_http_request_carries_no_part_of_the_dsn(
    monkeypatch: pytest.MonkeyPatch, logging_restored: None
) -> None:
    with (
        _recording_server() as (url, received),
        sentry_capture(monkeypatch),
        urllib.request.urlopen(url, timeout=5) as answer,
    ):
        assert answer.status == 204
    (headers,) = received
    assert DSN_KEY not in json.dumps(headers), headers


@pytest.mark.xfail(
    strict=True,
    reason="leak: the Dramatiq integration's before_enqueue writes _sentry_headers (baggage with "
    "sentry-public_key, SENTRY_DSN's key) into every message's options: RabbitMQ bodies, dead "
    "letters kept until purged, exports and `jobctl dlq show` carry it",
)
def test_a_sent_message_carries_no_part_of_the_dsn(
    monkeypatch: pytest.MonkeyPatch, logging_restored: None
) -> None:
    with sentry_capture(monkeypatch):
        broker = StubBroker()
        actor = dramatiq.actor(broker=broker, queue_name="review6")(settle)
        actor.send(1)
    body = broker.queues["review6"].get_nowait()
    assert DSN_KEY not in body.decode(), body


async def _empty_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An ASGI app that serves nothing (the test is about uvicorn's own lines)."""
    if scope["type"] == "lifespan":
        message = await receive()
        while message["type"] != "lifespan.shutdown":
            await send({"type": f"{message['type']}.complete"})
            message = await receive()
        await send({"type": "lifespan.shutdown.complete"})


def _run_until_started(server: uvicorn.Server, sockets: list[socket.socket] | None = None) -> None:
    """``uvicorn.Server.run`` as ``dashboard.server.run_uvicorn`` calls it, stopped once started."""

    async def main() -> None:
        serving = asyncio.ensure_future(server.serve(sockets=sockets))
        while not server.started and not serving.done():
            await asyncio.sleep(0.01)
        server.should_exit = True
        await serving

    asyncio.run(main())


def test_a_dashboard_serving_sends_sentry_no_address(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, logging_restored: None
) -> None:
    port = free_port()
    settings = load_settings({"DASHBOARD_ADMIN_PASSWORD": "an-admin-password-long-enough"})
    monkeypatch.setattr(
        dashboard.server,
        "HealthSampler",
        lambda project: SimpleNamespace(start=lambda: None, stop=lambda: None),
    )
    monkeypatch.setattr(dashboard.server, "create_app", lambda *args: _empty_app)
    monkeypatch.setattr(uvicorn.Server, "run", _run_until_started)
    with fresh_store("sqlite", tmp_path) as store, sentry_capture(monkeypatch) as events:
        project = SimpleNamespace(settings=settings, store=store)
        listener = dashboard.server.bind_listener("127.0.0.1", port)
        dashboard.server.serve(project, listener, "127.0.0.1", port)  # type: ignore[arg-type]
        logging.getLogger("tests").error("later_error")  # any later error carries the breadcrumbs
    sent = json.dumps(events)
    assert "dashboard_started" in sent  # the breadcrumbs went
    assert f":{port}" not in sent, [
        b for e in events for b in e.get("breadcrumbs", {}).get("values", []) if str(port) in json.dumps(b)
    ]
