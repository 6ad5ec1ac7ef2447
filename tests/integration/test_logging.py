"""The logging set-up outside the worker: a process that imports ``actors`` (as ``jobctl`` does) and
the scheduler log through the same processors, scrubbed, in JSON or console format."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from tests.pii_corpus import leaks
from tests.support import BIN, ROOT, wait_for

SCRIPT = r"""
import logging, threading, warnings
import structlog
import actors  # configures logging (and the scrubber) from the environment
from tests.pii_corpus import free_text, keyed

log, stdlib = structlog.get_logger("inproc"), logging.getLogger("inproc.stdlib")
log.info("customer_seen", **keyed())
log.info("customer_note", note=free_text())
log.info(f"free text event: {free_text()}")
stdlib.warning("note: %s", free_text())
stdlib.warning("customer %r", keyed(), extra={"customer": keyed(), "email": "ana.lopez@example.com"})
stdlib.error("two placeholders %s %s, one argument", free_text())
try:
    raise RuntimeError(f"failed for {keyed()!r}: {free_text()}")
except RuntimeError:
    log.exception("structlog_failure")
    stdlib.exception("stdlib failure")
warnings.warn(f"warning about {free_text()}")
thread = threading.Thread(target=lambda: 1 / 0 if free_text() else None, name="crasher")
thread.start()
thread.join()
"""


def _run(log_format: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LOG_FORMAT": log_format, "LOG_LEVEL": "INFO"}
    return subprocess.run(
        [str(BIN / "python"), "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


def test_json_lines_in_process_are_scrubbed_and_complete():
    result = _run("json")
    assert result.returncode == 0, result.stderr
    output = result.stdout + result.stderr
    assert leaks(output) == []
    lines = [json.loads(line) for line in result.stderr.splitlines()]
    assert all({"timestamp", "level", "event", "logger"} <= set(line) for line in lines)
    events = {line["event"]: line for line in lines}
    assert events["customer_seen"]["full_name"] == "[name]"
    assert events["note: " + events["customer_note"]["note"]]["logger"] == "inproc.stdlib"
    (record,) = [line for line in lines if line["event"].startswith("customer {'full_name': '[name]'")]
    assert record["customer"]["full_name"] == "[name]" and record["email"] == "[email]"  # extras
    assert "RuntimeError: failed for {'full_name': '[name]'" in events["stdlib failure"]["exception"]
    assert "RuntimeError: failed for" in events["structlog_failure"]["exception"]
    assert any(e.startswith("two placeholders %s %s, one argument [arguments dropped") for e in events)
    assert any(line["logger"] == "py.warnings" for line in lines)
    (crash,) = [line for line in lines if line["event"] == "uncaught_exception"]
    assert crash["where"] == "crasher" and "ZeroDivisionError" in crash["exception"]


def test_console_lines_in_process_are_scrubbed():
    result = _run("console")
    assert result.returncode == 0, result.stderr
    assert leaks(result.stdout + result.stderr) == []
    assert "customer_seen" in result.stderr and "[email]" in result.stderr


@pytest.mark.timeout(60)
def test_scheduler_logs_through_the_same_processors(tmp_path):
    log = tmp_path / "scheduler.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(BIN / "python"), "-m", "scheduler"],
            cwd=ROOT,
            env={**os.environ, "LOG_FORMAT": "json"},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        wait_for(lambda: "scheduler_started" in log.read_text(), what="scheduler start")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    loggers = {line["logger"] for line in lines}
    # structlog's own events and standard-library records (the leader lease logs through
    # ``logging``) alike; APScheduler's per-fire INFO lines are turned down to WARNING on purpose.
    assert "scheduler" in loggers and "jobsystem.store.leader" in loggers
