"""Wildcard cron schedules across DST changes, as crontab runs them: at every instant the clock
shows a matching time, so no extra fire for an hour skipped in spring, and each pass of an hour
repeated in autumn once, never two fires at one instant (fixed times: ``test_scheduler_config``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from scheduler.triggers import CronSchedule, fires_between, next_fires

NEW_YORK, BERLIN = "America/New_York", "Europe/Berlin"


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def local(expression: str, tz: str, start: datetime, hours: int) -> list[str]:
    """The fires within ``hours`` after ``start`` as local day, time and zone abbreviation."""
    zone = ZoneInfo(tz)
    fires = fires_between(CronSchedule(expression, tz), start, start + timedelta(hours=hours))
    return [f"{f.astimezone(zone):%d %H:%M %Z}" for f in fires]


@pytest.mark.parametrize(
    ("tz", "start", "expected"),
    [
        # 2026-03-08: 02:00 EST jumps to 03:00 EDT.
        (NEW_YORK, utc(2026, 3, 8, 4), ["08 00:00 EST", "08 04:00 EDT", "08 06:00 EDT"]),
        # 2026-03-29: 02:00 CET jumps to 03:00 CEST.
        (BERLIN, utc(2026, 3, 28, 22), ["29 00:00 CET", "29 04:00 CEST", "29 06:00 CEST"]),
    ],
)
def test_every_two_hours_gains_no_fire_in_the_skipped_hour(tz, start, expected):
    """02:00 does not exist and 03:00 is odd: crontab runs nothing until 04:00 (03:00 was added)."""
    assert local("0 */2 * * *", tz, start, 7) == expected


@pytest.mark.parametrize(
    ("tz", "start", "expected"),
    [
        (NEW_YORK, utc(2026, 3, 8, 5, 30), ["08 01:00 EST", "08 03:00 EDT", "08 04:00 EDT"]),
        (BERLIN, utc(2026, 3, 28, 23, 30), ["29 01:00 CET", "29 03:00 CEST", "29 04:00 CEST"]),
    ],
)
def test_hourly_runs_each_hour_the_clock_shows_in_spring(tz, start, expected):
    """One hour elapses from 01:00 to 03:00 of the new clock: nothing is made up or added."""
    assert local("0 * * * *", tz, start, 3) == expected


def test_a_wildcard_minute_in_the_skipped_hour_does_not_run_that_day():
    """``*/20 2 * * *`` has no 02:00 on 8 March: crontab runs nothing that day (it ran at 03:00 EDT)."""
    assert local("*/20 2 * * *", NEW_YORK, utc(2026, 3, 7, 12), 48) == [
        "09 02:00 EDT",
        "09 02:20 EDT",
        "09 02:40 EDT",
    ]


@pytest.mark.parametrize(
    ("expression", "tz", "start", "expected"),
    [
        # 2026-11-01: 02:00 EDT falls back to 01:00 EST; 01:00-01:59 comes twice.
        ("0 */2 * * *", NEW_YORK, utc(2026, 11, 1, 3), ["01 00:00 EDT", "01 02:00 EST", "01 04:00 EST"]),
        (
            "0 * * * *",
            NEW_YORK,
            utc(2026, 11, 1, 3, 30),
            ["01 00:00 EDT", "01 01:00 EDT", "01 01:00 EST", "01 02:00 EST", "01 03:00 EST", "01 04:00 EST"],
        ),
        # 2026-10-25: 03:00 CEST falls back to 02:00 CET; 02:00-02:59 comes twice, crontab runs
        # a wildcard hour's 02:00 in each pass.
        (
            "0 */2 * * *",
            BERLIN,
            utc(2026, 10, 24, 21),
            ["25 00:00 CEST", "25 02:00 CEST", "25 02:00 CET", "25 04:00 CET"],
        ),
        # A fixed time in the repeat runs once, at its first pass.
        ("0 2 * * *", BERLIN, utc(2026, 10, 24, 21), ["25 02:00 CEST"]),
    ],
)
def test_fall_back_runs_each_pass_once_and_no_instant_twice(expression, tz, start, expected):
    assert local(expression, tz, start, 6) == expected
    fires = list(next_fires(CronSchedule(expression, tz), start, 50))
    instants = [f.astimezone(UTC) for f in fires]
    assert instants == sorted(set(instants))  # strictly increasing: no fire twice
