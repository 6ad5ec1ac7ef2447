"""Fixtures of the unit tier: in-process, on the real Redis and SQLite store backends; no RabbitMQ,
no worker subprocess."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from jobsystem.observability.job_lines import install_job_lines
from jobsystem.store import StateStore
from tests.support import fresh_store


@pytest.fixture(params=["redis", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StateStore]:
    """Each state store backend in turn, in a namespace of the test's own (deleted after)."""
    with fresh_store(request.param, tmp_path) as state:
        yield state


@pytest.fixture
def logging_restored() -> Iterator[None]:
    """For tests that call ``configure_logging``: afterwards the root and ``pika`` loggers, the
    hooks, stdout and stderr, structlog's configuration and context, and the installed job lines,
    as before."""
    root, pika = logging.getLogger(), logging.getLogger("pika")
    handlers, level = root.handlers[:], root.level
    pika_handlers, pika_level = pika.handlers[:], pika.level
    hooks, stdout, stderr = sys.excepthook, sys.stdout, sys.stderr
    yield
    root.handlers, root.level, sys.excepthook = handlers, level, hooks
    pika.handlers, pika.level = pika_handlers, pika_level
    sys.stdout, sys.stderr = stdout, stderr
    structlog.contextvars.clear_contextvars()
    structlog.reset_defaults()
    install_job_lines(None)


class _Tracebacks(logging.Handler):
    """Notes each record that carries a traceback, as it reaches this handler."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info or record.exc_text or record.stack_info:
            self.seen.append(f"{record.name}: {record.msg}")


@pytest.fixture
def pika_tracebacks() -> Iterator[list[str]]:
    """pika's records that carried a traceback as pika logged it. ``configure_logging`` (which
    ``import actors`` runs) puts ``PikaAddresses`` on the ``pika`` logger, and it strips every pika
    record's traceback before the root logger's handlers (``caplog``) see the record: this handler
    goes first on the ``pika`` logger, so it sees them whole."""
    pika, spy = logging.getLogger("pika"), _Tracebacks()
    pika.handlers.insert(0, spy)
    yield spy.seen
    pika.removeHandler(spy)


@pytest.fixture
def emitted(monkeypatch: pytest.MonkeyPatch) -> list[logging.LogRecord]:
    """The records that went the ordinary way (through a stream handler's ``emit``)."""
    records: list[logging.LogRecord] = []
    original = logging.StreamHandler.emit

    def spy(self: logging.StreamHandler, record: logging.LogRecord) -> None:  # type: ignore[type-arg]
        records.append(record)
        original(self, record)

    monkeypatch.setattr(logging.StreamHandler, "emit", spy)
    return records


@pytest.fixture
def actor_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Callable[..., Any]:
    """Call it with setting changes (``smtp_url=...``): the reference actors then read them, with
    ``REPORTS_DIR`` and ``MEDIA_DIR`` in ``tmp_path`` and a 2 s ``SMTP_TIMEOUT`` unless changed."""
    from actors import emails, media, reports

    def configure(**changes: Any) -> Any:
        defaults = {"reports_dir": tmp_path / "reports", "media_dir": tmp_path / "media", "smtp_timeout": 2.0}
        changed = emails.settings.model_copy(update={**defaults, **changes})
        for module in (emails, media, reports):
            monkeypatch.setattr(module, "settings", changed)
        return changed

    return configure
