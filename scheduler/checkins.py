"""Sentry cron monitors: one per schedule, one check-in per fire, as Sentry's crons model expects.

The leader opens a fire's check-in (``in_progress``) at its first attempt and closes it once:
``ok`` when its message is confirmed by RabbitMQ, ``error`` when the fire is given up (still
unsent when older than ``misfire_grace``). The sends retried every 5 s in between (RabbitMQ
down) check in nothing, so an outage is not a flood of check-ins. Sentry raises an issue for an
error, for a check-in that does not arrive within the schedule's margin (the scheduler down, no
leader, a fire skipped) and for one left open past the grace (``max_runtime``). A check-in's id
is derived from its fire, as the message id is: a leader taking over a fire closes the check-in
the old one opened. Each check-in carries the monitor's configuration, so monitors are created
and kept in step with the schedules file.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal

import sentry_sdk
from sentry_sdk.crons import capture_checkin
from sentry_sdk.crons.consts import MonitorStatus

from jobsystem.observability.logs import get_logger
from jobsystem.observability.sentry import configure_sentry
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
#: Sentry's longest check-in margin and run time, in minutes (28 days).
_MAX_MINUTES = 40_320


def monitor_slug(schedule_id: str) -> str:
    """Sentry's slug for a schedule: lower-case letters, digits, ``-`` and ``_``, at most 50."""
    return re.sub(r"[^a-z0-9_-]", "-", schedule_id.lower())[:50]


def monitor_config(schedule: Schedule) -> MonitorConfig | None:
    """The monitor's configuration, or None when Sentry cannot express the schedule (an interval
    that is not a whole number of minutes)."""
    grace = max(1, math.ceil(schedule.misfire_grace.total_seconds() / 60))
    margin = min(grace, _MAX_MINUTES)
    # A fire stays in progress until sent or given up after the grace: no timeout before that.
    runtime = min(grace + 1, _MAX_MINUTES)
    if schedule.cron is not None:
        return {
            "schedule": {"type": "crontab", "value": schedule.cron},
            "timezone": schedule.timezone,
            "checkin_margin": margin,
            "max_runtime": runtime,
        }
    assert schedule.every is not None
    seconds = int(schedule.every.total_seconds())
    for unit, size in _UNITS:
        if seconds % size == 0:
            return {
                "schedule": {"type": "interval", "value": seconds // size, "unit": unit},
                "checkin_margin": margin,
                "max_runtime": runtime,
            }
    return None


def check_in_id(fire_key: str) -> str:
    """The Sentry check-in id of the fire named ``fire_key``: the same on every replica."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"sentry-check-in:{fire_key}").hex


class CheckIns:
    """Sends the check-ins of ``schedules``; those Sentry cannot monitor are logged once and left out.

    Called from the scheduler's one sending thread, under the schedule's lock.
    """

    def __init__(self, schedules: Iterable[Schedule]) -> None:
        self.monitors: dict[str, MonitorConfig] = {}
        #: Per schedule, the fires whose check-in is open (by UTC instant: the two passes of an
        #: hour the clock repeats are equal as times of one zone), and its id.
        self._open: dict[str, dict[datetime, str]] = {}
        for schedule in schedules:
            config = monitor_config(schedule)
            if config is None:
                logger.warning("sentry_monitor_unsupported", schedule=schedule.id, every=schedule.spec)
            else:
                self.monitors[schedule.id] = config
                self._open[schedule.id] = {}

    def started(self, schedule: Schedule, fire_time: datetime, fire_key: str) -> None:
        """Open the check-in of a fire at its first attempt; its retries send nothing."""
        opened, instant = self._open.get(schedule.id), fire_time.astimezone(UTC)
        if opened is None or instant in opened:
            return
        opened[instant] = check_in_id(fire_key)
        self._capture(schedule, opened[instant], MonitorStatus.IN_PROGRESS)

    def sent(self, schedule: Schedule, fire_time: datetime) -> None:
        """Close a fire's check-in ``ok``: its message is confirmed."""
        opened, instant = self._open.get(schedule.id), fire_time.astimezone(UTC)
        if opened is not None and instant in opened:
            self._capture(schedule, opened.pop(instant), MonitorStatus.OK)

    def given_up(self, schedule: Schedule, *, last: datetime | None, due: Iterable[datetime]) -> None:
        """Close ``error`` the open fires that are no longer ``due`` and were never sent (older
        than the grace); those at or before ``last``, the last fire sent, were sent by another
        leader, which closed them, and are forgotten."""
        opened = self._open.get(schedule.id)
        if not opened:
            return
        last_sent = last.astimezone(UTC) if last is not None else None
        for instant in sorted(opened.keys() - {fire_time.astimezone(UTC) for fire_time in due}):
            checkin = opened.pop(instant)
            if last_sent is None or instant > last_sent:
                self._capture(schedule, checkin, MonitorStatus.ERROR)

    def _capture(self, schedule: Schedule, checkin: str, status: str) -> None:
        capture_checkin(
            monitor_slug=monitor_slug(schedule.id),
            check_in_id=checkin,
            status=status,
            monitor_config=self.monitors[schedule.id],
        )


def sentry_checkins(settings: Settings, schedules: Iterable[Schedule]) -> CheckIns | None:
    """Check-ins when ``SENTRY_DSN`` is set and ``SENTRY_CRONS`` is on; Sentry is started here as
    in every process (its scrubber on every event) unless something else did it first (then its
    options stand)."""
    if not settings.sentry_dsn:
        return None
    if not sentry_sdk.is_initialized():
        configure_sentry(settings)
    return CheckIns(schedules) if settings.sentry_crons else None
