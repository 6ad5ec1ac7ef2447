"""Alerts on queue health: each degraded condition logged and sent to Sentry once, when it opens.

Open conditions are remembered in the state store (``health:open``), so a condition lasting an hour
alerts once, not sixty times, and alerts again only after it cleared and came back. A condition
this check could not measure is not taken as cleared. While the store is down nothing
de-duplicates: every condition (the store's own among them) is sent at each check.

What is sent says of a dependency that did not answer only which one, and the error's class
name (the report's texts, :mod:`jobsystem.ops.outages`). So do this module's log lines at WARNING
and up, which Sentry's logging integration sends as events and breadcrumbs: the error's own text,
which names hosts and ports, is in DEBUG lines only (the check's ``health_unreachable``, and
``health_alert_state_unavailable_cause`` here).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from typing import Any

import sentry_sdk

from jobsystem.observability.logs import get_logger
from jobsystem.observability.sentry import client_options
from jobsystem.ops.health import HealthReport
from jobsystem.ops.outages import reason
from jobsystem.privacy.setup import get_scrubber
from jobsystem.settings import Settings
from jobsystem.store.base import StateStore, StoreUnavailable

__all__ = ["OPEN_CONDITIONS_TTL_MS", "alert"]

logger = get_logger(__name__)

#: How long an open condition is remembered without a check confirming it (then it may alert again).
OPEN_CONDITIONS_TTL_MS = 86_400_000
#: The clients of :func:`_sentry_client`, by the settings their options are made of.
_clients: dict[tuple[Any, ...], sentry_sdk.Client] = {}
_clients_lock = threading.Lock()


def _sentry_client(settings: Settings) -> sentry_sdk.Client:
    """A Sentry client of its own (no integrations): health events do not depend on global set-up.
    Its options are every client's (the scrubber, no host name); one client per configuration."""
    scrubber = get_scrubber(settings)
    names = (settings.sentry_environment, settings.sentry_release, settings.sentry_server_name)
    key = (settings.sentry_dsn, *names, scrubber)
    with _clients_lock:
        if key not in _clients:
            options = client_options(settings, scrubber)
            _clients[key] = sentry_sdk.Client(**options, default_integrations=False)
        return _clients[key]


def _send_to_sentry(settings: Settings, condition: str, queue: str, kind: str, detail: str) -> None:
    if not settings.sentry_dsn:
        return
    client = _sentry_client(settings)
    scope = sentry_sdk.Scope(client=client)
    scope.set_tag("condition", condition)
    scope.set_tag("queue", queue)
    scope.set_tag("kind", kind)
    scope.set_extra("detail", detail)
    scope.fingerprint = ["queue-health", condition]
    client.capture_event(
        {"message": f"queue degraded: {condition} ({detail})", "level": "warning"}, scope=scope
    )
    client.flush(timeout=5)


def _conditions(report: HealthReport) -> dict[str, dict[str, str]]:
    """The degraded conditions of ``report`` by name (``kind:queue``; the system's by kind)."""
    current = {p.kind: {"queue": "", "kind": p.kind, "detail": p.detail} for p in report.problems}
    current.update(
        {
            f"{p.kind}:{h.queue}": {"queue": h.queue, "kind": p.kind, "detail": p.detail}
            for h in report.queues
            for p in h.problems
        }
    )
    if report.status == "unreachable":
        current["unreachable:broker"] = {"queue": "", "kind": "unreachable", "detail": report.error or ""}
    return current


def _record(
    report: HealthReport, current: dict[str, dict[str, str]], state: StateStore
) -> tuple[list[str], dict[str, str]] | None:
    """Compare ``current`` with the open conditions in the store and remember it: the conditions
    that opened and those that cleared (with their queue); None while another check holds the lease.

    A condition clears only when this check judged it: its queue checked (the system's: the broker
    reached) and its kind measured (an age the peek could not read stays open)."""
    checked = {h.queue for h in report.queues} | ({""} if report.status != "unreachable" else set())
    unjudged = {(h.queue, kind) for h in report.queues for kind in h.unjudged}
    unjudged |= {("", kind) for kind in report.unjudged}
    owner = uuid.uuid4().hex
    if not state.acquire_lease("health:check", owner, 60_000):
        return None
    try:
        raw = state.get("health:open")
        known: dict[str, dict[str, Any]] = json.loads(raw) if raw else {}
        new = [c for c in current if c not in known]
        cleared = {
            c: v["queue"]
            for c, v in known.items()
            if v["queue"] in checked and c not in current and (v["queue"], v["kind"]) not in unjudged
        }
        now = int(time.time() * 1000)
        remembered = {c: v for c, v in known.items() if c not in cleared}
        remembered.update({c: {**current[c], "since": now} for c in new})
        state.set("health:open", json.dumps(remembered), ttl_ms=OPEN_CONDITIONS_TTL_MS)
    finally:
        with contextlib.suppress(StoreUnavailable):  # it expires: the conditions are recorded, send them
            state.release_lease("health:check", owner)
    return new, cleared


def alert(report: HealthReport, *, state: StateStore, settings: Settings) -> list[str]:
    """Log and send to Sentry each degraded condition of ``report`` that just opened; returns them.

    Checks of other queues leave their conditions alone. Concurrent checks take turns on a lease.
    While the state store does not answer, every current condition is sent (nothing de-duplicates
    them then), after an ERROR line.
    """
    current = _conditions(report)
    try:
        recorded = _record(report, current, state)
    except StoreUnavailable as exc:
        # ERROR lines are Sentry events and WARNING ones breadcrumbs: the error's text (hosts,
        # ports) only at DEBUG, as the check's own causes.
        logger.error("health_alert_state_unavailable", conditions=sorted(current), error=reason(exc))
        logger.debug("health_alert_state_unavailable_cause", cause=str(exc))
        recorded = list(current), {}
    if recorded is None:
        logger.info("health_check_concurrent")
        return []
    new, cleared = recorded
    for condition in new:
        info = current[condition]
        logger.warning("queue_degraded", condition=condition, queue=info["queue"], detail=info["detail"])
        _send_to_sentry(settings, condition, info["queue"], info["kind"], info["detail"])
    for condition, queue in cleared.items():
        logger.info("queue_recovered", condition=condition, queue=queue)
    return new
