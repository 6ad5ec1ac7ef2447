"""An in-process client of the dashboard's ASGI app (no httpx here, so no Starlette TestClient):
one request through the whole app, its middleware included, as an ASGI server sends it. Each
call runs on an event loop of its own, so the app's thread pool is a new one every time: its
worker threads end when the call returns."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from types import SimpleNamespace
from typing import Any
from urllib.parse import unquote

from dashboard.app import create_app
from dashboard.auth import Credentials, User
from jobsystem.ops.health import HealthReport

__all__ = ["ADMIN", "VIEWER", "Answer", "app_of", "call"]

#: The test users' passwords of an app built in process (``Credentials(ADMIN[1], VIEWER[1])``).
ADMIN = ("admin", "admin-password-for-tests")
VIEWER = ("viewer", "viewer-password-for-tests")


class Answer:
    def __init__(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.status_code, self.text = status, body.decode(errors="replace")
        self.headers = headers or {}

    def json(self) -> Any:
        return json.loads(self.text)


def call(
    app: Any,
    method: str,
    target: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    auth: tuple[str, str] | None = ADMIN,
) -> Answer:
    """One request through the whole app (its middleware included), as an ASGI server sends it."""
    path, _, query = target.partition("?")
    sent = [(b"host", b"testserver")]
    if auth is not None:
        sent.append((b"authorization", b"Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode())))
    sent += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": unquote(path),
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": sent,
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }
    incoming = [{"type": "http.request", "body": json.dumps(body).encode() if body is not None else b""}]
    status, chunks = [500], []
    answered: dict[str, str] = {}

    async def receive() -> dict[str, Any]:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status[0] = message["status"]
            answered.update((k.decode().lower(), v.decode()) for k, v in message.get("headers", []))
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    try:
        asyncio.run(app(scope, receive, send))
    except Exception as exc:  # Starlette answers 500, then raises it again for the server to log
        return Answer(500, repr(exc).encode())
    return Answer(status[0], b"".join(chunks), answered)


def app_of(project: Any, report: HealthReport | None = None) -> tuple[Any, dict[str, str]]:
    """The dashboard's app over ``project`` (a :class:`dashboard.project.Project`, or a stand-in
    with what the pages read), the queues' health as ``report`` says, and the headers an admin's
    POST carries (same origin, the CSRF token)."""
    credentials = Credentials(ADMIN[1], VIEWER[1])
    sampler = SimpleNamespace(latest=lambda: (report, time.time(), 0.1))
    post = {
        "Content-Type": "application/json",
        "Origin": "http://testserver",
        "X-CSRF-Token": credentials.csrf_token(User("admin")),
    }
    return create_app(project, credentials, sampler), post  # type: ignore[arg-type]
