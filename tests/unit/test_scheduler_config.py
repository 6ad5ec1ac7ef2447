"""The scheduler without processes: fire times (cron, DST, intervals), the misfire plan, the
schedules file's checks and ``--check`` (Sentry check-ins: ``test_scheduler_checkins``)."""

from __future__ import annotations

import textwrap
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest

from jobsystem.system import get_system
from scheduler.plan import plan_fires
from scheduler.schedules import DEFAULT_FILE, ScheduleError, load_schedules
from scheduler.triggers import CronSchedule, fires_between, interval_trigger, next_fires, parse_duration
from tests import workload  # noqa: F401 - declares the test actors

NEW_YORK = "America/New_York"


def local(expression: str, start: datetime, count: int, tz: str = NEW_YORK) -> list[str]:
    """The next fires as local wall-clock time with the zone's abbreviation."""
    zone = ZoneInfo(tz)
    return [
        f"{f.astimezone(zone):%m-%d %H:%M %Z}" for f in next_fires(CronSchedule(expression, tz), start, count)
    ]


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def test_spring_forward_a_fixed_time_in_the_skipped_hour_fires_once_an_hour_later():
    # 2024-03-10: 02:00 EST jumps to 03:00 EDT; 02:30 does not exist that day.
    assert local("30 2 * * *", utc(2024, 3, 8, 12), 3) == [
        "03-09 02:30 EST",
        "03-10 03:30 EDT",
        "03-11 02:30 EDT",
    ]


def test_fall_back_a_fixed_time_in_the_repeated_hour_fires_once():
    # 2024-11-03: 02:00 EDT falls back to 01:00 EST; 01:30 happens twice, crontab runs it once.
    assert local("30 1 * * *", utc(2024, 11, 2, 0), 3) == [
        "11-02 01:30 EDT",
        "11-03 01:30 EDT",
        "11-04 01:30 EST",
    ]
    assert local("30 2 * * *", utc(2024, 11, 2, 0), 3) == [
        "11-02 02:30 EDT",
        "11-03 02:30 EST",
        "11-04 02:30 EST",
    ]


def test_nine_am_stays_nine_am_local_across_both_changes():
    for start in (utc(2024, 3, 8), utc(2024, 11, 1)):
        fires = list(next_fires(CronSchedule("0 9 * * *", NEW_YORK), start, 5))
        assert {f"{f.astimezone(ZoneInfo(NEW_YORK)):%H:%M}" for f in fires} == {"09:00"}
        assert len({f.astimezone(UTC).hour for f in fires}) == 2  # 14:00Z in winter, 13:00Z in summer


def wall_clock_fires(expression: str, tz: str, start: datetime, end: datetime) -> list[datetime]:
    """The fires of a fixed-time ``expression`` (minute, hour, and a day of month or a day of the
    week, or ``*``) found by reading the zone's clock every quarter hour: each time it exists."""
    minute, hour, day, _, weekday = expression.split()
    zone, fires, moment = ZoneInfo(tz), [], start
    while moment < end:
        wall = moment.astimezone(zone)
        if (
            (wall.minute, wall.hour) == (int(minute), int(hour))
            and day in ("*", str(wall.day))
            and weekday in ("*", str(wall.isoweekday() % 7))
            and wall.fold == 0
        ):
            fires.append(moment)
        moment += timedelta(minutes=15)
    return fires


@pytest.mark.parametrize("tz", [NEW_YORK, "Europe/Paris", "Australia/Sydney", "Pacific/Auckland"])
@pytest.mark.parametrize("expression", ["0 0 * * *", "30 0 * * *", "0 0 1 * *", "0 0 * * 1", "15 4 * * *"])
def test_fixed_times_fire_on_each_day_they_exist_through_a_year_of_changes(expression, tz):
    """APScheduler 3 alone skips the midnight after clocks go forward (New York 2024-03-11,
    Paris 04-01 for ``@monthly``): a step over the change lands an hour late."""
    start, end = utc(2024, 1, 1), utc(2025, 1, 1)
    found = [f.astimezone(UTC) for f in fires_between(CronSchedule(expression, tz), start, end)]
    assert found == wall_clock_fires(expression, tz, start + timedelta(minutes=15), end)


def skipped_times_shifted(expression: str, tz: str, start: datetime, end: datetime) -> list[datetime]:
    """The fires of ``minutes hours * * *`` (comma lists) as the module says: each wall-clock time
    once, a skipped one at the instant it had before the change (``fold=0``)."""
    minutes, hours = ([int(v) for v in field.split(",")] for field in expression.split()[:2])
    zone, day, fires = ZoneInfo(tz), start.date() - timedelta(days=1), set()
    while day <= end.date() + timedelta(days=1):
        for hour in hours:
            for minute in minutes:
                wall = datetime(day.year, day.month, day.day, hour, minute, tzinfo=zone)
                fires.add(wall.astimezone(UTC))
        day += timedelta(days=1)
    return sorted(f for f in fires if start < f <= end)


@pytest.mark.parametrize(
    ("expression", "tz", "change"),
    [
        # Clocks go forward at midnight: 00:00 does not exist; the day's fire was lost.
        ("0 0 * * *", "America/Santiago", utc(2023, 9, 3, 4)),
        ("30 0 * * *", "America/Havana", utc(2023, 3, 12, 5)),
        ("0 0 * * *", "Asia/Beirut", utc(2023, 3, 25, 22)),
        ("0 0 * * *", "Africa/Cairo", utc(2023, 4, 27, 22)),
        # A fixed time in the gap reached from an earlier time of the same day: lost too.
        ("0 1,2 * * *", NEW_YORK, utc(2024, 3, 10, 7)),
        ("30 1,2 * * *", "Europe/Paris", utc(2024, 3, 31, 1)),
        ("0 0,1 * * *", "Europe/London", utc(2024, 3, 31, 1)),
        ("0,30 2 * * *", "Australia/Sydney", utc(2023, 9, 30, 16)),
    ],
)
def test_a_fixed_time_the_spring_change_skips_still_fires_once(expression, tz, change):
    start, end = change - timedelta(days=2), change + timedelta(days=2)
    found = [f.astimezone(UTC) for f in fires_between(CronSchedule(expression, tz), start, end)]
    assert found == skipped_times_shifted(expression, tz, start, end)


def test_a_dense_fixed_time_schedule_is_still_quick_near_a_change():
    trigger = CronSchedule("0-59 1-3 * * *", NEW_YORK)
    fires = list(fires_between(trigger, utc(2024, 3, 10, 5), utc(2024, 3, 10, 9)))
    # 01:00-01:59 EST, the skipped 02:00-02:59 at 03:00-03:59 EDT (the same instants as 03:xx).
    assert len(fires) == 120 and len({f.astimezone(UTC) for f in fires}) == 120


def test_a_wildcard_hour_runs_by_elapsed_time_through_the_changes():
    for start in (utc(2024, 3, 10, 5), utc(2024, 11, 3, 4)):
        # In UTC: datetimes sharing a tzinfo subtract by wall clock.
        fires = [f.astimezone(UTC) for f in next_fires(CronSchedule("*/30 * * * *", NEW_YORK), start, 12)]
        gaps = {b - a for a, b in pairwise(fires)}
        assert gaps == {timedelta(minutes=30)}


def test_cron_follows_crontab_not_apscheduler_3():
    monday = utc(2024, 9, 2, 12)  # a Monday
    assert local("0 9 * * 1-5", monday, 5, "UTC") == [
        "09-03 09:00 UTC",
        "09-04 09:00 UTC",
        "09-05 09:00 UTC",
        "09-06 09:00 UTC",
        "09-09 09:00 UTC",
    ]
    # 0 and 7 are Sunday.
    assert local("0 0 * * 0", monday, 1, "UTC") == local("0 0 * * 7", monday, 1, "UTC") == ["09-08 00:00 UTC"]
    # Both day fields restricted: the 13th OR a Friday.
    assert local("0 9 13 * 5", utc(2024, 10, 1), 4, "UTC") == [
        "10-04 09:00 UTC",
        "10-11 09:00 UTC",
        "10-13 09:00 UTC",
        "10-18 09:00 UTC",
    ]
    assert local("@daily", monday, 1, "UTC") == ["09-03 00:00 UTC"]


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("0 9 * *", "5"),
        ("61 * * * *", "61"),
        ("0 9 * * mon-fry", "day of week"),
        ("0 9 last * *", "not standard cron"),
        ("0 9 L * *", "not standard cron"),
        ("0 9 * * 5-1", "backwards"),
    ],
)
def test_bad_cron_expressions_say_why(expression, message):
    with pytest.raises(ValueError, match=message):
        CronSchedule(expression)


def test_intervals_are_aligned_so_every_replica_names_the_same_fires():
    every = parse_duration("15m")
    first = next(next_fires(interval_trigger(every), utc(2024, 1, 1, 10, 7, 13), 1))
    second = next(next_fires(interval_trigger(every), utc(2024, 1, 1, 10, 14, 59), 1))
    assert first == second == utc(2024, 1, 1, 10, 15)
    assert parse_duration("1h30m") == timedelta(minutes=90)
    for bad in ("", "0s", "1.5s", "5 minutes", "-1m"):
        with pytest.raises(ValueError):
            parse_duration(bad)


EVERY_SECOND = interval_trigger(timedelta(seconds=1))


HOURLY = CronSchedule("0 * * * *")


T0 = utc(2024, 5, 1, 12)


def every_second(*, last: float | None, now: float, started: float, grace_s: float):
    """``plan_fires`` of a schedule firing every second, its times given in seconds after ``T0``."""

    def at(seconds: float) -> datetime:
        return T0 + timedelta(seconds=seconds)

    return plan_fires(
        EVERY_SECOND,
        last=None if last is None else at(last),
        now=at(now),
        started_at=at(started),
        grace=timedelta(seconds=grace_s),
    )


def test_a_restart_within_the_grace_coalesces_the_missed_fires_into_one():
    plan = every_second(last=0, now=3.6, started=3.5, grace_s=30)
    assert plan.send == [T0 + timedelta(seconds=3)]
    assert (plan.coalesced, plan.skipped) == (2, False)


def test_fires_older_than_the_grace_are_skipped():
    plan = plan_fires(
        HOURLY,
        last=T0,
        now=T0 + timedelta(minutes=90),
        started_at=T0 + timedelta(minutes=89),
        grace=timedelta(minutes=5),
    )
    assert plan.send == [] and plan.skipped
    # The 14:00 fire is 3 minutes old: sent; 13:00 is not.
    later = T0 + timedelta(hours=2, minutes=3)
    plan = plan_fires(HOURLY, last=T0, now=later, started_at=later, grace=timedelta(minutes=5))
    assert plan.send == [T0 + timedelta(hours=2)] and plan.skipped
    # Exactly as old as the grace is still in time.
    plan = plan_fires(
        HOURLY, last=T0, now=T0 + timedelta(hours=1, minutes=5), started_at=T0, grace=timedelta(minutes=5)
    )
    assert plan.send == [T0 + timedelta(hours=1)] and not plan.skipped


def test_fires_due_while_the_process_ran_are_each_sent():
    # A standby up since long before the leader died catches up every fire of the take-over gap.
    plan = every_second(last=0, now=3.2, started=-60, grace_s=30)
    assert plan.send == [T0 + timedelta(seconds=s) for s in (1, 2, 3)] and plan.coalesced == 0


def test_a_schedule_that_never_fired_starts_with_the_process():
    plan = every_second(last=None, now=2.1, started=0.5, grace_s=300)
    assert plan.send == [T0 + timedelta(seconds=1), T0 + timedelta(seconds=2)]
    assert not plan.skipped


def load(tmp_path, text: str):
    path = tmp_path / "schedules.toml"
    path.write_text(textwrap.dedent(text))
    return load_schedules(path, get_system().broker.actors, max_priority=10)


def test_the_reference_schedules_are_valid():
    schedules = {s.id: s for s in load_schedules(DEFAULT_FILE, get_system().broker.actors)}
    report = schedules["daily-sales-report"]
    assert (report.actor, report.cron, report.timezone, report.kwargs) == (
        "generate_report",
        "0 9 * * *",
        NEW_YORK,
        {"kind": "sales"},
    )
    assert schedules["purge-expired-exports"].actor == "purge_exports"
    assert schedules["queue-health-check"].actor == "check_health"


def test_an_entry_with_every_option(tmp_path):
    [schedule] = load(
        tmp_path,
        """
        [[schedule]]
        id = "tick"
        actor = "scheduled"
        args = ["tick"]
        every = "30s"
        queue = "elsewhere"
        priority = 5
        misfire_grace = 90
        enabled = false
        """,
    )
    assert (schedule.every, schedule.queue, schedule.priority) == (timedelta(seconds=30), "elsewhere", 5)
    assert (schedule.misfire_grace, schedule.enabled, schedule.spec) == (
        timedelta(seconds=90),
        False,
        "every 30s",
    )


GOOD = """
[[schedule]]
id = "good"
actor = "purge_exports"
every = "1h"
"""


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ('id = "a"\nactor = "genrate_report"\nevery = "1h"', "schedule 'a': unknown actor 'genrate_report'"),
        (
            'id = "b"\nactor = "purge_exports"\ncron = "0 25 * * *"',
            "schedule 'b': bad cron expression '0 25 * * *'",
        ),
        (
            'id = "c"\nactor = "purge_exports"\ncron = "0 9 * * *"\ntimezone = "Mars/Olympus"',
            "schedule 'c': timezone: unknown time zone 'Mars/Olympus'",
        ),
        (  # a directory of zones, not a zone: ZoneInfo raises IsADirectoryError
            'id = "c2"\nactor = "purge_exports"\ncron = "0 9 * * *"\ntimezone = "US"',
            "schedule 'c2': timezone: unknown time zone 'US'",
        ),
        (
            'id = "d"\nactor = "purge_exports"\nevery = "1h"\ncolour = "red"',
            "schedule 'd': unknown key colour",
        ),
        (
            'id = "e"\nactor = "purge_exports"\nevery = "1h"\ncron = "0 9 * * *"',
            "schedule 'e': has both cron and every",
        ),
        ('actor = "purge_exports"\nevery = "1h"', "schedule #2: missing id"),
        ('id = "good"\nactor = "purge_exports"\nevery = "2h"', "schedule 'good': duplicate id"),
        ('id = "f"\nactor = "purge_exports"', "schedule 'f': needs cron or every"),
        ('id = "g"\nactor = "purge_exports"\nevery = "soon"', "schedule 'g': every must be a duration"),
        ('id = "h"\nactor = "purge_exports"\nevery = "1h"\npriority = 11', "schedule 'h': priority must be"),
        (
            'id = "i"\nactor = "generate_report"\nevery = "1h"\nkwargs = { colour = "red" }',
            "do not fit generate_report",
        ),
        (
            'id = "j"\nactor = "purge_exports"\nevery = "1h"\ntimezone = "UTC"',
            "timezone applies to cron only",
        ),
    ],
)
def test_a_bad_entry_fails_with_its_name(tmp_path, entry, expected):
    with pytest.raises(ScheduleError) as caught:
        load(tmp_path, f"{GOOD}\n[[schedule]]\n{entry}\n")
    assert expected in str(caught.value)
    assert len(caught.value.problems) == 1  # the good entry passes


def test_every_problem_is_reported_at_once(tmp_path):
    with pytest.raises(ScheduleError) as caught:
        load(tmp_path, 'title = "x"\n[[schedule]]\nid = "a"\nactor = "nope"\ncron = "bad"\n')
    problems = "\n".join(caught.value.problems)
    assert "unknown top-level key title" in problems and "unknown actor 'nope'" in problems
    assert "bad cron expression 'bad'" in problems


def test_a_file_that_is_not_toml_or_is_missing(tmp_path):
    with pytest.raises(ScheduleError, match="not valid TOML"):
        load(tmp_path, "[[schedule]\n")
    with pytest.raises(ScheduleError, match="cannot read"):
        load_schedules(tmp_path / "missing.toml", get_system().broker.actors)
