"""Sentry as a process with ``SENTRY_DSN`` has it, its events kept in memory by the test.

``sentry_sdk.init`` is wrapped to hand the client a transport of the test's own: whatever starts
Sentry (``configure_sentry``, the scheduler's check-ins) sends its events (after ``before_send``)
to a list, as the JSON the SDK would send.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dramatiq
import pytest
import sentry_sdk
from dramatiq.brokers.stub import StubBroker
from sentry_sdk.envelope import Envelope
from sentry_sdk.transport import Transport

from jobsystem.observability.logs import configure_logging
from jobsystem.observability.sentry import configure_sentry
from jobsystem.settings import Settings, load_settings

__all__ = [
    "DSN",
    "DSN_KEY",
    "ROOT",
    "memory_sentry",
    "sentry_capture",
    "sentry_settings",
    "settle",
    "work_off",
]

#: The project's root: the working directory of its processes, so its modules (and a user's
#: actors module beside them) are the application's own code (``in_app``) to the SDK.
ROOT = Path(__file__).resolve().parents[1]
#: The key of the DSN the tests configure: the credential of ``SENTRY_DSN``.
DSN_KEY = "0123456789abcdef0123456789abcdef"
DSN = f"http://{DSN_KEY}@127.0.0.1:9/42"


class _Memory(Transport):
    """Keeps the events the SDK would send (after ``before_send``), as the JSON it would send."""

    def __init__(self, options: dict[str, Any], events: list[dict[str, Any]]) -> None:
        super().__init__(options)
        self.events = events

    def capture_envelope(self, envelope: Envelope) -> None:
        for item in envelope.items:
            if item.type == "event" and item.payload.json is not None:
                self.events.append(json.loads(json.dumps(item.payload.json, default=str)))


def sentry_settings(**environ: str) -> Settings:
    """The settings of a process with ``SENTRY_DSN`` (JSON log lines at INFO), and ``environ``."""
    return load_settings({"SENTRY_DSN": DSN, "LOG_FORMAT": "json", "LOG_LEVEL": "INFO", **environ})


@contextlib.contextmanager
def memory_sentry(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """Yields the events sent by the client that whatever runs in the block starts. The client
    and the breadcrumbs are dropped afterwards, so none rides on a later block's or test's events."""
    events: list[dict[str, Any]] = []
    real_init = sentry_sdk.init

    def init(*args: Any, **options: Any) -> Any:
        return real_init(*args, transport=_Memory(options, events), **options)

    try:
        with monkeypatch.context() as patched:  # undone at the block's end: blocks may follow
            patched.setattr(sentry_sdk, "init", init)
            yield events
        sentry_sdk.flush(5)
    finally:
        sentry_sdk.get_client().close()
        sentry_sdk.get_global_scope().set_client(None)
        for scope in (sentry_sdk.get_isolation_scope(), sentry_sdk.get_current_scope()):
            scope.clear_breadcrumbs()
        sentry_sdk.get_global_scope().clear_breadcrumbs()


@contextlib.contextmanager
def sentry_capture(monkeypatch: pytest.MonkeyPatch, **environ: str) -> Iterator[list[dict[str, Any]]]:
    """Logging and Sentry set up as a process with ``SENTRY_DSN`` (and ``environ``) has them;
    yields the events sent. The caller restores logging (``logging_restored``)."""
    settings = sentry_settings(**environ)
    with memory_sentry(monkeypatch) as events:
        logging.getLogger().addHandler(logging.StreamHandler(io.StringIO()))
        configure_logging(settings)
        configure_sentry(settings)
        yield events


def settle(account: Any) -> None:
    """An application's actor (module-level, as in a user's ``actors`` module) that fails."""
    raise RuntimeError("settlement failed")


def work_off(broker: StubBroker, queue: str) -> None:
    """Run ``broker``'s messages on ``queue`` (a stub broker's) in a worker until none is left."""
    worker = dramatiq.Worker(broker, worker_timeout=50)
    worker.start()
    try:
        broker.join(queue, fail_fast=False)
        worker.join()
    finally:
        worker.stop()
