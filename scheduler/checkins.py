"""Sentry cron monitors: one per schedule, a check-in per fire.

The leader checks in ``ok`` when a fire's message is confirmed by RabbitMQ and ``error`` when it
cannot be sent; Sentry raises an issue for an error and for a check-in that does not arrive
within the schedule's margin (the scheduler down, no leader, a fire skipped). Each check-in carries
the monitor's configuration, so monitors are created and kept in step with the schedules file.
Duplicates (a fire another replica sent) do not check in.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Literal

import sentry_sdk
from sentry_sdk.crons import capture_checkin
from sentry_sdk.crons.consts import MonitorStatus

from jobsystem.observability.logs import get_logger
from jobsystem.settings import Settings
from scheduler.schedules import Schedule

if TYPE_CHECKING:
    from sentry_sdk._types import MonitorConfig

logger = get_logger(__name__)

_UNITS: tuple[tuple[Literal["day", "hour", "minute"], int], ...] = (
    ("day", 86_400),
    ("hour", 3_600),
    ("minute", 60),
)


def monitor_slug(schedule_id: str) -> str:
    """Sentry's slug for a schedule: lower-case letters, digits, ``-`` and ``_``, at most 50."""
    return re.sub(r"[^a-z0-9_-]", "-", schedule_id.lower())[:50]


def monitor_config(schedule: Schedule) -> MonitorConfig | None:
    """The monitor's configuration, or None when Sentry cannot express the schedule (an interval
    that is not a whole number of minutes)."""
    margin = max(1, math.ceil(schedule.misfire_grace.total_seconds() / 60))
    if schedule.cron is not None:
        return {
            "schedule": {"type": "crontab", "value": schedule.cron},
            "timezone": schedule.timezone,
            "checkin_margin": margin,
        }
    assert schedule.every is not None
    seconds = int(schedule.every.total_seconds())
    for unit, size in _UNITS:
        if seconds % size == 0:
            return {
                "schedule": {"type": "interval", "value": seconds // size, "unit": unit},
                "checkin_margin": margin,
            }
    return None


class CheckIns:
    """Sends the check-ins of ``schedules``; those Sentry cannot monitor are logged once and left out."""

    def __init__(self, schedules: Iterable[Schedule]) -> None:
        self.monitors: dict[str, MonitorConfig] = {}
        for schedule in schedules:
            config = monitor_config(schedule)
            if config is None:
                logger.warning("sentry_monitor_unsupported", schedule=schedule.id, every=schedule.spec)
            else:
                self.monitors[schedule.id] = config

    def report(self, schedule: Schedule, *, ok: bool) -> None:
        """Check in for one fire of ``schedule``: ``ok`` once sent, ``error`` when it could not be."""
        config = self.monitors.get(schedule.id)
        if config is None:
            return
        capture_checkin(
            monitor_slug=monitor_slug(schedule.id),
            status=MonitorStatus.OK if ok else MonitorStatus.ERROR,
            monitor_config=config,
        )


def sentry_checkins(settings: Settings, schedules: Iterable[Schedule]) -> CheckIns | None:
    """Check-ins when ``SENTRY_DSN`` is set and ``SENTRY_CRONS`` is on; Sentry is initialised here
    unless something else in the process did it first (then its options stand)."""
    if not settings.sentry_dsn:
        return None
    if not sentry_sdk.is_initialized():
        sentry_sdk.init(
            dsn=settings.sentry_dsn,
            environment=settings.sentry_environment,
            release=settings.sentry_release,
            send_default_pii=False,
        )
    return CheckIns(schedules) if settings.sentry_crons else None
