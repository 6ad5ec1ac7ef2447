"""Review 5 (a new user's run of ``jobctl dashboard``): uvicorn passes every record of its own a
``color_message`` extra, its text with ANSI colour codes, for its own formatter. ``jobctl
dashboard`` does not use that formatter (``log_config=None``) but the project's, whose
``ExtraAdder`` copies every extra into the event: the start lines then read
``Started server process [4397] ... color_message='Started server process [\\x1b[36m%d\\x1b[0m]'``,
on the terminal and in JSON logs alike (escape codes and a ``%d`` template in every log sink)."""

from __future__ import annotations

import io
import logging

import pytest
import structlog

from jobsystem.observability.logs import configure_logging
from jobsystem.settings import load_settings

# What uvicorn's server logs at start (uvicorn/server.py): the plain text, and a coloured twin.
_COLOURED = "Started server process [\x1b[36m%d\x1b[0m]"


def _uvicorn_start_line(log_format: str) -> str:
    configure_logging(load_settings({"LOG_FORMAT": log_format, "LOG_LEVEL": "INFO"}))
    record = logging.getLogger("uvicorn.error").makeRecord(
        "uvicorn.error",
        logging.INFO,
        __file__,
        1,
        "Started server process [%d]",
        (4397,),
        None,
        extra={"color_message": _COLOURED},
    )
    handler = logging.getLogger().handlers[0]
    assert handler.formatter is not None
    return handler.formatter.format(record)


@pytest.mark.parametrize("log_format", ["console", "json"])
def test_the_dashboards_uvicorn_lines_carry_no_colour_template(
    log_format: str, logging_restored: None
) -> None:
    line = _uvicorn_start_line(log_format)
    assert "Started server process [4397]" in line  # the line itself is kept
    assert "color_message" not in line
    assert "\x1b" not in line and "\\x1b" not in line and "\\u001b" not in line


@pytest.mark.parametrize("log_format", ["console", "json"])
def test_no_logger_renders_a_colour_template_and_its_other_extras_stay(
    log_format: str, logging_restored: None
) -> None:
    """Any library's record with such an extra, and a structlog event given one, lose it alone."""
    sink = io.StringIO()
    logging.getLogger().handlers = [logging.StreamHandler(sink)]
    configure_logging(load_settings({"LOG_FORMAT": log_format, "LOG_LEVEL": "INFO"}))
    extra = {"color_message": _COLOURED, "port": 8000}
    logging.getLogger("some.library").info("listening", extra=extra)
    structlog.get_logger("jobsystem.dashboard").info("dashboard_started", **extra)
    lines = sink.getvalue().splitlines()
    assert len(lines) == 2
    for line in lines:
        assert "color_message" not in line
        assert "\x1b" not in line and "\\x1b" not in line and "\\u001b" not in line
        assert "8000" in line  # other extras are still fields
