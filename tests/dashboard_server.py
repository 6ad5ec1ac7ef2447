"""The dashboard under test: ``jobctl dashboard`` in a subprocess, and the test users' passwords."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

import requests

from tests.servers import free_port
from tests.support import wait_for
from tests.workers import Process

#: The dashboard's passwords in the tests (never printed by it: tests/integration/test_dashboard_http.py).
DASHBOARD_ADMIN = "admin-Pa55word-for-tests"
DASHBOARD_VIEWER = "viewer-Pa55word-for-tests"


class Dashboard(Process):
    """``jobctl dashboard tests.workload`` in a subprocess on a free port, output captured;
    ``command`` runs in place of ``jobctl`` (a module of the tests that wraps it)."""

    def __init__(self, log_path: Path, env: dict[str, str], command: tuple[str, ...] = ("jobctl",)) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [*command, "dashboard", "tests.workload", "--port", str(self.port)]
        super().__init__(argv, log_path, env)

    def wait_ready(self, timeout: float = 30.0) -> None:
        def answering() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"dashboard exited with {self.proc.returncode}:\n{self.output()}")
            try:
                return requests.get(self.url + "/", timeout=2).status_code == 401
            except requests.ConnectionError:
                return False

        wait_for(answering, timeout, interval=0.2, what="the dashboard to answer")

    def get(self, path: str, auth: tuple[str, str] | None, **kwargs: Any) -> requests.Response:
        return requests.get(self.url + path, auth=auth, timeout=60, **kwargs)

    def post(
        self, path: str, auth: tuple[str, str], body: Any, *, token: str | None = None
    ) -> requests.Response:
        """A POST as the dashboard's own page sends it (JSON, same origin, the CSRF token)."""
        if token is None:
            token = self.get("/api/csrf", auth).json()["token"]
        headers = {"Origin": self.url, "X-CSRF-Token": token}
        return requests.post(self.url + path, auth=auth, json=body, headers=headers, timeout=300)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()
