"""Lifecycle events take the short path to the log stream (jobsystem.observability.direct_lines):
the same line as the ordinary path, scrubbed, and the ordinary path whenever a handler needs it."""

from __future__ import annotations

import io
import json
import logging

import pytest
import structlog

from jobsystem.observability.logs import configure_logging
from jobsystem.settings import load_settings
from middleware.lifecycle import DEFAULT_LOGGER

FIELDS = {"message_id": "6a1f0c3e-2b4d-4f5a-9c8e-7d6b5a4c3b2a", "attempt": 1, "duration_ms": 1.5}


pytestmark = pytest.mark.usefixtures("logging_restored")


def _configure(handler: logging.Handler, log_format: str = "json") -> None:
    root = logging.getLogger()
    root.handlers = [handler]
    configure_logging(load_settings({"LOG_FORMAT": log_format, "LOG_LEVEL": "INFO"}))


def test_a_lifecycle_event_is_written_directly_and_matches_the_ordinary_line(emitted):
    stream = io.StringIO()
    _configure(logging.StreamHandler(stream))
    structlog.get_logger(DEFAULT_LOGGER).info("job_succeeded", note="mail ana.lopez@example.com", **FIELDS)
    assert emitted == []  # no LogRecord, no formatter
    structlog.get_logger("elsewhere").info("job_succeeded", note="mail ana.lopez@example.com", **FIELDS)
    assert len(emitted) == 1
    direct, ordinary = (json.loads(line) for line in stream.getvalue().splitlines())
    assert direct["logger"] == DEFAULT_LOGGER and ordinary["logger"] == "elsewhere"
    for line in (direct, ordinary):
        del line["logger"], line["timestamp"]
    assert direct == ordinary
    assert direct["note"] == "mail [email]" and direct["level"] == "info"
    assert direct["message_id"] == FIELDS["message_id"] and direct["duration_ms"] == 1.5


def test_warnings_and_other_handlers_take_the_ordinary_path(emitted):
    class Capture(logging.StreamHandler):  # type: ignore[type-arg]
        pass

    stream = io.StringIO()
    _configure(logging.StreamHandler(stream))
    structlog.get_logger(DEFAULT_LOGGER).warning("job_skipped", **FIELDS)
    assert [r.levelno for r in emitted] == [logging.WARNING]
    _configure(Capture(stream))
    structlog.get_logger(DEFAULT_LOGGER).info("job_started", **FIELDS)
    assert len(emitted) == 2
    events = [json.loads(line)["event"] for line in stream.getvalue().splitlines()]
    assert events == ["job_skipped", "job_started"]


def test_console_format_takes_the_short_path_too(emitted):
    stream = io.StringIO()
    _configure(logging.StreamHandler(stream), "console")
    structlog.get_logger(DEFAULT_LOGGER).info("job_started", email="ana.lopez@example.com")
    assert emitted == []
    assert "job_started" in stream.getvalue() and "ana.lopez" not in stream.getvalue()
