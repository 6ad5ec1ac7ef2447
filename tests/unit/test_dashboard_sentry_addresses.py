"""With the state store down, the store's address must not reach Sentry from the dashboard's audit
lines through the SDK's logging integration (on with ``SENTRY_DSN``): an ERROR line is an event of
its own, so it names the error's class only; the error's text is a DEBUG line. ab623cf did so for
the health sampler; ``dashboard_audit_unwritable`` and ``dashboard_audit_unfinished`` still sent
``redis: ConnectionError: Error 111 connecting to <host>:<port>``."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from jobsystem.store import StateStore, open_store
from jobsystem.store.base import StoreUnavailable
from tests.asgi import call
from tests.servers import free_port, sent_to_sentry
from tests.unit.test_dashboard_app import dashboard


def _sent_to_sentry(act: Callable[[], None]) -> str:
    """What Sentry received while ``act`` ran, as JSON text (set up as the dashboard's process
    is with ``SENTRY_DSN``)."""
    return sent_to_sentry(act)[0]


def test_an_action_whose_audit_entry_cannot_be_written_sends_sentry_no_store_address(
    logging_restored: None,
) -> None:
    port = free_port()
    down = open_store(f"redis://127.0.0.1:{port}/0", namespace="t-down:")

    def purge() -> None:
        app, _, post = dashboard(down)
        action = call(app, "POST", "/api/dead-letters/purge", {"all": True}, post)
        assert action.status_code == 503 and "audit log unwritable" in action.json()["error"]

    try:
        sent = _sent_to_sentry(purge)
    finally:
        down.close()
    assert "dashboard_audit_unwritable" in sent  # the line is an event
    assert f"127.0.0.1:{port}" not in sent
    assert '"error": "StoreUnavailable"' in sent


def test_an_action_whose_audit_entry_cannot_be_finished_sends_sentry_no_store_address(
    store: StateStore, logging_restored: None
) -> None:
    address = f"10.9.8.7:{free_port()}"

    def purge() -> None:
        app, project, post = dashboard(store)  # RabbitMQ down: the purge fails, its entry is finished

        def finish(*_: Any) -> None:
            raise StoreUnavailable(f"redis: ConnectionError: Error 111 connecting to {address}.")

        project.audit = SimpleNamespace(start=project.audit.start, finish=finish)
        action = call(app, "POST", "/api/dead-letters/purge", {"all": True}, post)
        assert action.status_code == 503, action.text

    sent = _sent_to_sentry(purge)
    assert "dashboard_audit_unfinished" in sent  # the line is an event
    assert address not in sent
    assert '"error": "StoreUnavailable"' in sent
