"""Review 5 (a new user's ``jobctl migrate-queues`` with the management API down or misnamed):
it prints requests' own error text and exits 1, e.g. ``jobctl: _Pool(host='127.0.0.1',
port=15679): Max retries exceeded with url: /api/queues/%2F?columns=... (Caused by
NewConnectionError("_Watched(host=...): Failed to establish a new connection: [Errno 111]
Connection refused"))``. The README's rule for every command: an unreachable service is one line,
named by its error's class (its text names hosts and ports: DEBUG log only), as
``jobctl health`` and ``jobctl dlq`` say it."""

from __future__ import annotations

import socket

from tests.jobctl_run import jobctl


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_migrate_queues_names_an_unreachable_management_api_by_class(prefix: str) -> None:
    port = _closed_port()
    run = jobctl(prefix, "migrate-queues", check=False, RABBITMQ_MANAGEMENT_URL=f"http://127.0.0.1:{port}")
    output = run.stdout + run.stderr
    assert run.returncode in (1, 2), output  # ping's 1 (management down) or the README's 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("jobctl: "), output
    assert str(port) not in output and "/api/" not in output, output
