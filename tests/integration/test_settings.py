"""Settings: validated once, errors name the variable and never echo a password."""

from __future__ import annotations

import os
import subprocess

from tests.support import BIN, ROOT


def _run(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=60, check=False
    )


def test_jobctl_reports_bad_settings_and_exits_2():
    result = _run([str(BIN / "jobctl"), "ping"], RABBITMQ_URL="amqp://u:hunter2@mq:bad/")
    assert result.returncode == 2
    assert "RABBITMQ_URL" in result.stderr
    assert "hunter2" not in result.stdout + result.stderr


def test_worker_refuses_to_start_on_bad_settings():
    result = _run(
        [str(BIN / "dramatiq"), "actors", "-p", "1", "-t", "1"],
        WORKER_THREADS="zero",
        SMTP_URL="ftp://x:hunter2@h",
    )
    assert result.returncode == 2
    output = result.stdout + result.stderr
    assert "WORKER_THREADS" in output and "SMTP_URL" in output
    assert "hunter2" not in output and "Traceback" not in output


def test_jobctl_ping_exits_2_when_the_broker_is_unreachable():
    result = _run(
        [str(BIN / "jobctl"), "ping", "--timeout", "2"], RABBITMQ_URL="amqp://u:hunter2@127.0.0.1:1/"
    )
    assert result.returncode == 2
    assert "unreachable" in result.stdout and "hunter2" not in result.stdout + result.stderr


def test_jobctl_ping_answers_ok():
    result = _run([str(BIN / "jobctl"), "ping"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rabbitmq    ok" in result.stdout
