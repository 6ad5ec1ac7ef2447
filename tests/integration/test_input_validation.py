"""Bad settings, schedules and command-line input: one clear line naming the variable, schedule
field or option, exit code 2, no traceback, and never a secret value, from every entry point."""

from __future__ import annotations

import json
import os
import subprocess
import uuid

import pytest
from click.testing import CliRunner

from jobctl.main import main as jobctl
from tests import workload
from tests.support import BIN, ROOT

SECRET = "hunter2"


AMQP = f"amqp://app:{SECRET}@127.0.0.1:5672/%2F"


REDIS = f"redis://app:{SECRET}@127.0.0.1:6379"


def run(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=60, check=False
    )


def assert_clean_exit(result: subprocess.CompletedProcess[str], *names: str) -> list[str]:
    """Exit 2; each of ``names`` on one line; no traceback and no secret; the error lines."""
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "Traceback" not in output and SECRET not in output, output
    lines = [line for line in output.splitlines() if "invalid setting" in line or "RabbitMQ has no" in line]
    for name in names:
        assert any(name in line for line in lines), output
    return lines


def test_the_worker_exits_2_with_one_line_per_problem_and_no_traceback():
    # Two worker processes meet the same error; one reports it for the group.
    result = run(
        [str(BIN / "dramatiq"), "actors", "-p", "2", "-t", "1"],
        SMTP_TIMEOUT="inf",
        STATE_URL=f"{REDIS}/abc",
    )
    lines = assert_clean_exit(result, "SMTP_TIMEOUT", "STATE_URL")
    assert len(lines) == 2, result.stderr


def test_the_worker_names_rate_limits_when_an_actor_needs_a_service_it_lacks():
    result = run([str(BIN / "dramatiq"), "actors", "-p", "1", "-t", "1"], RATE_LIMITS="{}")
    (line,) = assert_clean_exit(result, "RATE_LIMITS")
    assert "'smtp'" in line


def test_jobctl_worker_checks_settings_and_modules_before_starting_dramatiq():
    assert_clean_exit(
        run([str(BIN / "jobctl"), "worker"], RABBITMQ_URL=f"{AMQP}?heartbeat=abc"), "RABBITMQ_URL"
    )
    result = run([str(BIN / "jobctl"), "worker", "tests.no_such_module", "-Q", "x"])
    assert result.returncode == 2 and "cannot import tests.no_such_module" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_scheduler_and_its_check_exit_2_on_bad_settings():
    for args in ((), ("--check",)):
        result = run([str(BIN / "python"), "-m", "scheduler", *args], STATE_TIMEOUT="nan", RATE_LIMITS="{}")
        assert_clean_exit(result, "STATE_TIMEOUT")


def test_jobctl_exits_2_when_rabbitmq_is_unreachable_instead_of_a_traceback():
    result = run(
        [str(BIN / "jobctl"), "dlq", "list"],
        RABBITMQ_URL=f"amqp://app:{SECRET}@127.0.0.1:1/%2F?connection_attempts=1",
        RABBITMQ_MANAGEMENT_URL="http://127.0.0.1:1",
    )
    assert result.returncode == 2 and "RabbitMQ unreachable" in result.stderr
    assert "Traceback" not in result.stderr and SECRET not in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("args", "checked"),
    [
        (["dlq", "list"], "{}.DLQ"),
        (["dlq", "show", "some-id"], "{}.DLQ"),
        (["dlq", "retry", "--all"], "{}.DLQ"),
        (["dlq", "purge", "--all", "--yes"], "{}.DLQ"),
        (["dlq", "export"], "{}.DLQ"),
        (["health"], "{}"),
        (["health", "--json"], "{}"),
        (["migrate-queues"], "{}"),
    ],
)
def test_a_queue_rabbitmq_does_not_have_is_an_error_naming_it(args, checked):
    typo = f"typo-{uuid.uuid4().hex[:8]}"
    result = CliRunner().invoke(jobctl, [*args, "--queue", typo])
    assert result.exit_code == 2, result.output
    (line,) = result.output.splitlines()
    assert line == f"jobctl: --queue '{typo}': RabbitMQ has no queue '{checked.format(typo)}' (vhost '/')"
    # Nothing was created for the typo (migrate-queues used to declare it).
    response = CliRunner().invoke(jobctl, ["health", "--queue", typo, "--json"])
    assert response.exit_code == 2


def test_health_of_a_queue_that_exists_still_reports(queues):
    name = queues.name(workload.record)
    queues.broker.declare_queue(name, ensure=True)
    result = CliRunner().invoke(jobctl, ["health", "--queue", name, "--json"])
    assert result.exit_code in (0, 1), result.output
    assert [q["queue"] for q in json.loads(result.output)["queues"]] == [name]


def test_a_schedules_file_that_is_not_utf8_is_one_line_from_check(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes('[[schedule]]\nid = "café"\n'.encode("latin-1"))
    result = run([str(BIN / "python"), "-m", "scheduler", "--check", "--schedules", str(path)])
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr == f"scheduler: {path}: not UTF-8 text (invalid byte at offset 22)\n"
