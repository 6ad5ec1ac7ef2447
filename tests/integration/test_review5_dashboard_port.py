"""Review 5 (a new user's run of ``jobctl dashboard``): started on a port another process holds (a
second dashboard, a forgotten one, another service on 8181), it first prints ``dashboard on
http://127.0.0.1:PORT/ (Ctrl-C stops it)``, which points the operator at the other process, then
uvicorn's own ERROR log line (``[Errno 98] error while attempting to bind on address ...``)
between its start-up and shutdown lines, and exits with uvicorn's code 3. The README's promise
for every command: a bad option is one line and exit code 2, never a traceback or a stack's log."""

from __future__ import annotations

import socket

from tests.dashboard_server import DASHBOARD_ADMIN
from tests.jobctl_run import jobctl


def test_a_dashboard_on_a_port_in_use_says_so_in_one_line_with_exit_code_2(prefix: str) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        run = jobctl(
            prefix, "dashboard", "--port", str(port), check=False, DASHBOARD_ADMIN_PASSWORD=DASHBOARD_ADMIN
        )
    output = run.stdout + run.stderr
    assert f"dashboard on http://127.0.0.1:{port}/" not in output, output  # it never served there
    assert run.returncode == 2, output
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("jobctl: ") and str(port) in last, output
