"""``jobctl dashboard`` checked its port by binding it and letting go, then uvicorn bound it
again: a process that took the port in between (another service starting, a second dashboard)
left the operator with uvicorn's own bind error and exit code 3 after ``dashboard on ...`` had
been printed. The dashboard now binds its socket once and uvicorn serves on it: the port is
never free between the check and the server (:mod:`tests.port_intruder` tries to take it)."""

from __future__ import annotations

from pathlib import Path

from tests.dashboard_server import DASHBOARD_ADMIN, Dashboard
from tests.support import worker_env


def test_no_process_can_take_the_port_between_the_check_and_the_server(prefix: str, tmp_path: Path) -> None:
    env = worker_env(prefix, tmp_path, DASHBOARD_ADMIN_PASSWORD=DASHBOARD_ADMIN)
    dashboard = Dashboard(tmp_path / "dashboard.log", env, command=("python", "-m", "tests.port_intruder"))
    try:
        dashboard.wait_ready()  # it answers on its port (a 401 without credentials)
        assert "intruder: refused" in dashboard.output(), dashboard.output()
    finally:
        dashboard.stop()
