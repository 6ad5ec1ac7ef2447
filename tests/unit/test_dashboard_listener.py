"""The dashboard's listening socket (:func:`dashboard.server.bind_listener`): bound and listening
before anything is announced, the very socket uvicorn serves on, and closed on every way out of
:func:`dashboard.server.serve` (a failure before uvicorn starts included)."""

from __future__ import annotations

import socket
from types import SimpleNamespace
from typing import Any

import pytest
import uvicorn

import dashboard.server
from dashboard.server import bind_listener, serve
from jobsystem.settings import load_settings

SETTINGS = load_settings({"DASHBOARD_ADMIN_PASSWORD": "an-admin-password-long-enough"})


def test_the_port_is_held_from_the_check_on_even_against_sockets_that_reuse_addresses() -> None:
    with bind_listener("127.0.0.1", 0) as listener:
        port = listener.getsockname()[1]
        with pytest.raises(OSError), socket.socket() as other:  # as uvicorn and asyncio bind
            other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            other.bind(("127.0.0.1", port))
        with pytest.raises(OSError):
            bind_listener("127.0.0.1", port)


def _project() -> Any:
    return SimpleNamespace(settings=SETTINGS, store=SimpleNamespace(kind="redis", label="redis://x/0"))


def _sampler(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    said: list[str] = []
    fake = SimpleNamespace(start=lambda: said.append("start"), stop=lambda: said.append("stop"))
    monkeypatch.setattr(dashboard.server, "HealthSampler", lambda project: fake)
    return said


def test_uvicorn_serves_on_the_socket_bound_and_it_is_closed_after(monkeypatch: pytest.MonkeyPatch) -> None:
    said = _sampler(monkeypatch)
    monkeypatch.setattr(dashboard.server, "create_app", lambda *args: "app")
    served: list[socket.socket] = []

    def run(config: Any, sockets: list[socket.socket]) -> None:
        assert config.app == "app" and sockets[0].fileno() != -1
        served.extend(sockets)
        raise KeyboardInterrupt  # as a second Ctrl-C ends uvicorn

    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets: run(self.config, sockets))
    listener = bind_listener("127.0.0.1", 0)
    with pytest.raises(KeyboardInterrupt):
        serve(_project(), listener, "127.0.0.1", listener.getsockname()[1])
    assert served == [listener] and listener.fileno() == -1 and said == ["start", "stop"]


def test_a_dashboard_that_fails_to_start_lets_its_port_go(monkeypatch: pytest.MonkeyPatch) -> None:
    said = _sampler(monkeypatch)

    def broken(*args: object) -> None:
        raise RuntimeError("templates missing")

    monkeypatch.setattr(dashboard.server, "create_app", broken)
    listener = bind_listener("127.0.0.1", 0)
    with pytest.raises(RuntimeError):
        serve(_project(), listener, "127.0.0.1", listener.getsockname()[1])
    assert listener.fileno() == -1 and said == ["start", "stop"]


def test_a_server_that_did_not_start_exits_3_as_uvicorn_run_did(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets: None)
    with bind_listener("127.0.0.1", 0) as listener, pytest.raises(SystemExit) as exited:
        dashboard.server.run_uvicorn(None, listener)  # type: ignore[arg-type]
    assert exited.value.code == 3
