"""The demo without the services: its production guide names real things, and its children stop
when it dies, SIGKILL included."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from demo.orphan_guard import EXIT_PARENT_GONE
from tests.support import ROOT, wait_for
from tests.workers import running


def test_the_production_guide_names_only_real_settings_and_commands():
    import re

    from jobctl.dlq import dlq
    from jobctl.main import main as jobctl
    from jobsystem.settings import Settings

    guide = (ROOT / "docs" / "production.md").read_text()
    settings = {name.upper() for name in Settings.model_fields}
    # compose.yaml's own variables, which users put in .env (documented in .env.example)
    compose = set(re.findall(r"^([A-Z][A-Z0-9_]+)=", (ROOT / ".env.example").read_text(), re.M))
    redis_replies = {"NOAUTH", "WRONGPASS", "OOM", "READONLY", "LOADING"}
    named = set(re.findall(r"`([A-Z][A-Z0-9_]{3,})(?:=[^`]*)?`", guide))
    assert named and named <= settings | compose | redis_replies, named - settings - compose
    for command, sub in re.findall(r"`jobctl ([a-z-]+)(?: ([a-z-]+))?", guide):
        assert command in jobctl.commands, command
        if command == "dlq":
            assert sub in dlq.commands, sub
    assert "jobctl migrate-queues" in guide and "consumer_timeout" in guide
    assert "docs/production.md" in (ROOT / "README.md").read_text()


#: A demo's child: says when it is up, and on SIGTERM writes which signal stopped it.
_CHILD = """
import os, signal, sys, time
from pathlib import Path

folder = Path(sys.argv[1])


def write_whole(name, text):
    # Written aside, then renamed: the test reads a file as soon as it exists, and must never
    # find it empty or in part (open() creates it empty, the text comes after).
    (folder / (name + ".new")).write_text(text)
    os.replace(folder / (name + ".new"), folder / name)


def stop(signum, frame):
    write_whole("stopped", signal.Signals(signum).name)
    sys.exit(0)


signal.signal(signal.SIGTERM, stop)
write_whole("child.pid", str(os.getpid()))
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    time.sleep(0.05)
"""

#: The demo in small: a thread running (its mail server's), a child started as the demo starts
#: the worker and the scheduler, then nothing until it is killed.
_PARENT = """
import os, sys, threading, time
from pathlib import Path

from demo.services import Child

folder = Path(sys.argv[1])
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
Child("child", [sys.executable, "-c", sys.argv[2], str(folder)], dict(os.environ), folder / "child.log")
time.sleep(60)
"""


def test_a_child_of_a_demo_killed_with_sigkill_gets_sigterm(tmp_path):
    demo = subprocess.Popen([sys.executable, "-c", _PARENT, str(tmp_path), _CHILD], cwd=ROOT)
    child = 0
    try:
        pid_file = tmp_path / "child.pid"
        wait_for(lambda: pid_file.exists() and pid_file.read_text(), timeout=20, what="the child")
        child = int(pid_file.read_text())
        assert running(child)
        demo.kill()
        assert demo.wait(10) == -signal.SIGKILL
        stopped = tmp_path / "stopped"
        wait_for(stopped.exists, timeout=10, what="the orphaned child's SIGTERM")
        assert stopped.read_text() == "SIGTERM"
        wait_for(lambda: not running(child), timeout=10, what="the orphaned child to exit")
    finally:
        demo.kill()
        demo.wait(10)
        if child and running(child):
            os.kill(child, signal.SIGKILL)  # the old code's orphan: it would sleep on otherwise


def test_the_guard_runs_nothing_once_its_parent_is_gone(tmp_path):
    # The demo died between starting the guard and the guard setting its parent-death signal:
    # the guard has another parent (pid 1, a subreaper) and the signal will never come.
    marker = tmp_path / "ran"
    code = f"open({str(marker)!r}, 'w').close()"
    not_the_parent = "1"
    guard = [sys.executable, "-m", "demo.orphan_guard", not_the_parent, sys.executable, "-c", code]
    assert subprocess.run(guard, cwd=ROOT, timeout=30).returncode == EXIT_PARENT_GONE
    assert not marker.exists()
    guard[3] = str(os.getpid())  # the real parent: the command runs
    assert subprocess.run(guard, cwd=ROOT, timeout=30).returncode == 0
    assert marker.exists()


def test_the_alive_thread_reconnects_at_once_then_backs_off_within_the_second_look():
    from itertools import islice

    from demo.alive import MAX_RETRY_S, SECOND_LOOK_S, retry_delays

    delays = list(islice(retry_delays(), 12))
    assert delays[0] == 0  # no fixed wait before the first new attempt
    assert all(0 < d <= MAX_RETRY_S for d in delays[1:])  # then never a spin, never past the cap
    assert delays[1:] == sorted(delays[1:]) and delays[-1] == MAX_RETRY_S
    assert SECOND_LOOK_S > MAX_RETRY_S  # a reconnecting demo is back before the sweep looks again


def test_the_demos_clean_up_errors_are_shown_scrubbed(monkeypatch, tmp_path):
    """A client's error (pika's, Redis's, the management API's) may quote what it was given: the
    demo prints it and writes it to its summary through the project's scrubber, which knows the
    configured passwords."""
    import argparse
    import tempfile
    import uuid

    import redis

    from demo import run, services

    password = f"pw-{uuid.uuid4().hex}"
    monkeypatch.setenv("RABBITMQ_URL", f"amqp://demo:{password}@127.0.0.1:5672/%2F")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    leak = f"connection to demo:{password}@127.0.0.1 refused; owner ana.lopez@example.com"

    def refused(*args: object) -> None:
        raise redis.ConnectionError(leak)

    monkeypatch.setattr(services, "delete_topology", refused)
    monkeypatch.setattr(services, "delete_state_keys", refused)
    demo = run.Demo(argparse.Namespace(short=True, smtp_url="smtp://127.0.0.1:1025", json_summary=None))
    demo.partner.start()
    demo.shutdown()
    errors = [demo.cleaned["queues_error"], demo.cleaned["state_error"]]
    assert all(error.startswith("ConnectionError: connection to") for error in errors), errors
    assert not [error for error in errors if password in error or "ana.lopez" in error], errors


def test_a_demo_whose_rabbitmq_is_down_stops_with_one_useful_line_and_no_folder(tmp_path):
    """RabbitMQ down: the demo cannot hold its alive queue. Its clean-up then waited for ever to
    stop a partner API it never started (and ignores Ctrl-C while cleaning up); it now says why in
    one line and exits 1, its folder never made. That line was ``AMQPConnectionError: `` (pika's
    error has no text): it now names the service that did not answer and what to do, and neither
    the address it tried nor the configured password."""
    import socket
    import uuid

    from demo.main import EXIT_FAILED

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed once the block ends: the connection is refused
    password = f"pw-{uuid.uuid4().hex}"
    env = {
        **os.environ,
        "RABBITMQ_URL": f"amqp://guest:{password}@127.0.0.1:{port}/%2F",
        "TMPDIR": str(tmp_path),
    }
    done = subprocess.run(
        [sys.executable, "-m", "demo", "--short"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = done.stdout + done.stderr
    assert done.returncode == EXIT_FAILED, output
    assert "demo stopped: RabbitMQ did not answer: is it running? `make services` starts it\n" in output
    assert "Traceback" not in output and "AMQPConnectionError" not in output
    assert password not in output and str(port) not in output and "127.0.0.1" not in output
    assert not list(tmp_path.glob("jobs-demo-*"))


def test_only_rabbitmq_not_answering_gets_the_fixed_line():
    """pika's bare ``AMQPConnectionError`` (nothing answered) has no text: the fixed line replaces
    it. Its subclasses carry RabbitMQ's answer, which stays, scrubbed."""
    from pika.adapters.utils.connection_workflow import AMQPConnectorSocketConnectError
    from pika.exceptions import AMQPConnectionError, ProbableAuthenticationError

    from demo.services import RABBITMQ_SILENT, error_line
    from jobsystem.settings import load_settings

    settings = load_settings(dict(os.environ))
    # What pika raises when nothing listens (its BlockingConnection wraps the socket's error).
    silent = AMQPConnectionError(AMQPConnectorSocketConnectError(ConnectionRefusedError(111, "refused")))
    assert error_line(settings, silent) == RABBITMQ_SILENT
    refused = ProbableAuthenticationError("ConnectionClosedByBroker: (403) 'ACCESS_REFUSED'")
    assert error_line(settings, refused) == f"ProbableAuthenticationError: {refused}"
