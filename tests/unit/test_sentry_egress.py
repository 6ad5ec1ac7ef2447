"""What leaves the process in Sentry's events: nothing of a job's arguments, a dashboard search
or the dashboard's address, with a real Sentry client (its events kept in memory).

Each test was a leak a review reproduced (frame locals, a request's query string and Referer,
Redis commands' keys and outgoing URLs as breadcrumbs, uvicorn's address line).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import dramatiq
import pytest
import uvicorn
from dramatiq.brokers.stub import StubBroker

import dashboard.server
from jobsystem.settings import load_settings
from tests.asgi import call
from tests.sentry_memory import ROOT, sentry_capture, settle, work_off
from tests.servers import recording_server
from tests.support import fresh_store
from tests.unit.test_dashboard_app import dashboard as dashboard_app


@pytest.mark.parametrize("argument", ["Lopez", {"Ana Lopez": 3}], ids=["surname", "name-as-key"])
def test_a_failing_actor_sends_sentry_none_of_its_arguments(
    argument: Any, monkeypatch: pytest.MonkeyPatch, logging_restored: None
) -> None:
    """The actor's own frame (``in_app``) kept a string without spaces and every dict key as they
    were: a job's argument (a surname, a name as a dict key) went through its locals."""
    monkeypatch.chdir(ROOT)
    with sentry_capture(monkeypatch) as events:
        broker = StubBroker()  # built after sentry_sdk.init: the integration's middleware is on it
        actor = dramatiq.actor(broker=broker, queue_name="egress", max_retries=0)(settle)
        actor.send(argument)
        work_off(broker, "egress")
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
    """Sentry's ASGI middleware attached the query string and the ``Referer`` (the previous page's,
    search and all) to a dashboard error's event: a search for an idempotency key, a name."""
    monkeypatch.chdir(ROOT)
    with fresh_store("sqlite", tmp_path) as store, sentry_capture(monkeypatch) as events:
        app, project, _ = dashboard_app(store)
        project.status = _BrokenStatus()
        answer = call(app, "GET", target, headers=headers)
    assert answer.status_code == 500, answer.text
    failed = [e for e in events if "dashboard_request_failed" in json.dumps(e)]
    assert failed, events  # the failure went to Sentry
    assert "Lopez" not in json.dumps(failed), failed[0].get("request")


def test_a_dashboard_search_sends_sentry_no_store_key_holding_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, logging_restored: None
) -> None:
    """The SDK's Redis integration (auto-enabled) made a breadcrumb of every command with its key;
    the dashboard looks a search up as a message id, so the searched text was a key."""
    monkeypatch.chdir(ROOT)
    with fresh_store("redis", tmp_path) as store, sentry_capture(monkeypatch) as events:
        app, project, _ = dashboard_app(store)
        project.idempotency = _BrokenStatus()  # after the status lookup (a Redis HGETALL): a 500
        answer = call(app, "GET", "/jobs?q=invoice%20Ana%20Lopez")
    assert answer.status_code == 500, answer.text
    (failed,) = [e for e in events if "dashboard_request_failed" in json.dumps(e)]
    crumbs = failed.get("breadcrumbs", {}).get("values", [])  # the request's, its Redis commands' included
    assert "Lopez" not in json.dumps(crumbs), [c for c in crumbs if "Lopez" in json.dumps(c)]


async def _empty_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An ASGI app that serves nothing (the test is about uvicorn's own lines)."""
    if scope["type"] == "lifespan":
        message = await receive()
        while message["type"] != "lifespan.shutdown":
            await send({"type": f"{message['type']}.complete"})
            message = await receive()
        await send({"type": "lifespan.shutdown.complete"})


def _run_until_started(server: uvicorn.Server, sockets: list[socket.socket] | None = None) -> None:
    """``uvicorn.Server.run`` as ``dashboard.server`` calls it, stopped once the server started."""

    async def main() -> None:
        serving = asyncio.ensure_future(server.serve(sockets=sockets))
        while not server.started and not serving.done():
            await asyncio.sleep(0.01)
        server.should_exit = True
        await serving

    asyncio.run(main())


def test_an_outgoing_requests_url_is_no_breadcrumb(
    monkeypatch: pytest.MonkeyPatch, logging_restored: None
) -> None:
    """The SDK's stdlib integration made a breadcrumb of each HTTP request the process made, with
    its URL and query string (an API an actor calls with a customer's name, the management API's
    host and port)."""
    with recording_server() as (url, received), sentry_capture(monkeypatch) as events:
        with urllib.request.urlopen(f"{url}?customer=Ana%20Lopez", timeout=5) as answer:
            assert answer.status == 204
        logging.getLogger("tests").error("later_error")  # any later error carries the breadcrumbs
    assert len(received) == 1
    (failed,) = [e for e in events if "later_error" in json.dumps(e)]
    host = url.split("/")[2]
    assert "Lopez" not in json.dumps(failed) and host not in json.dumps(failed), failed.get("breadcrumbs")


def test_a_dashboard_serving_sends_sentry_no_address(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, logging_restored: None
) -> None:
    """uvicorn's INFO line 'Uvicorn running on http://<host>:<port>' was a breadcrumb (and an INFO
    log line): the dashboard's address, which the project keeps at DEBUG. uvicorn serving on the
    socket the dashboard bound does not write it; its other lines and its errors still go."""
    settings = load_settings({"DASHBOARD_ADMIN_PASSWORD": "an-admin-password-long-enough"})
    monkeypatch.setattr(
        dashboard.server,
        "HealthSampler",
        lambda project: SimpleNamespace(start=lambda: None, stop=lambda: None),
    )
    monkeypatch.setattr(dashboard.server, "create_app", lambda *args: _empty_app)
    monkeypatch.setattr(uvicorn.Server, "run", _run_until_started)
    listener = dashboard.server.bind_listener("127.0.0.1", 0)
    port = listener.getsockname()[1]
    with fresh_store("sqlite", tmp_path) as store, sentry_capture(monkeypatch) as events:
        project = SimpleNamespace(settings=settings, store=store)
        dashboard.server.serve(project, listener, "127.0.0.1", port)  # type: ignore[arg-type]
        logging.getLogger("uvicorn.error").error("later_error")  # uvicorn's own error, with the breadcrumbs
    sent = json.dumps(events)
    assert "dashboard_started" in sent and "Application startup complete" in sent  # uvicorn's lines went
    assert "later_error" in sent
    assert f":{port}" not in sent and f", {port}" not in sent, [
        b for e in events for b in e.get("breadcrumbs", {}).get("values", []) if str(port) in json.dumps(b)
    ]
