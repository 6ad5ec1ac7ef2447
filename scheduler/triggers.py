"""Fire times: standard crontab expressions in an IANA time zone, and fixed intervals.

Every replica of the scheduler must compute the *same* fire times, because a fire's idempotency
key is built from its scheduled time. So intervals are aligned to the Unix epoch (``every = "15m"``
fires at :00, :15, :30 and :45 UTC, whenever the process started) instead of APScheduler's
default of "now + interval", and cron times come from the expression and its time zone only.

APScheduler 3's cron trigger differs from standard cron in four ways, corrected here:

- day of week: 0 is Sunday in crontab (7 too), Monday in APScheduler 3;
- when both day of month and day of week are restricted, crontab fires when *either* matches
  (APScheduler requires both);
- on the autumn DST change a fixed time such as ``30 1 * * *`` occurs twice; crontab runs it once
  (the first time), APScheduler twice. A fixed time that does not exist on the spring change
  (``30 2 * * *`` in New York) fires once, at the same instant as before the change (03:30 EDT);
- jobs whose minute or hour starts with ``*`` run whenever the clock shows a matching time, as in
  crontab: in both passes of a repeated hour, never in a skipped one (APScheduler 3 moved a
  skipped time to the gap's end: ``0 */2 * * *`` in New York fired at 03:00 EDT on the spring
  change day, where crontab runs 00:00 EST then 04:00 EDT).

So all times are found on the wall clock (UTC triggers run over local times) and placed in the
zone by :mod:`scheduler.wall_clock`: APScheduler 3 stepping through a zone also skips a fixed time
in the gap when it reaches it from an earlier time of the same day (``0 1,2 * * *`` in New York)
or when the gap is at midnight (``0 0 * * *`` in Santiago, Havana, Beirut, Cairo: a day without a
fire).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

from scheduler.wall_clock import next_fire

#: Fixed intervals count from here, so every replica fires at the same instants.
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: The longest ``every`` or ``misfire_grace``: ten years (the settings' limit for durations too).
#: Past it datetime arithmetic overflows (``every = "99999999999d"``) and fire times leave the calendar.
MAX_DURATION = timedelta(days=3650)

_DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


def _field_pattern(token: str) -> re.Pattern[str]:
    """A comma-separated list of ``*``, ``N`` or ``N-M``, each with an optional ``/step``."""
    item = rf"(?:\*|{token}(?:-{token})?)(?:/\d+)?"
    return re.compile(rf"^{item}(?:,{item})*$")


_NUMBERS = _field_pattern(r"\d+")
_NAMES = _field_pattern(r"(?:\d+|[a-z]{3})")  # month (jan-dec) and day of week (sun-sat)
_PATTERNS = (_NUMBERS, _NUMBERS, _NUMBERS, _NAMES, _NAMES)
_FIELD_NAMES = ("minute", "hour", "day-of-month", "month", "day-of-week")
_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


def parse_duration(text: str) -> timedelta:
    """``"30s"``, ``"5m"``, ``"1h"``, ``"1d"`` or combinations (``"1h30m"``) as a timedelta."""
    match = _DURATION.match(text.strip().lower())
    if not text.strip() or match is None:
        raise ValueError("must be a duration such as 30s, 5m, 1h, 1d or 1h30m")
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    return seconds_duration(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def seconds_duration(seconds: int) -> timedelta:
    """``seconds`` as a timedelta, refused unless above zero and at most :data:`MAX_DURATION`."""
    if seconds <= 0:
        raise ValueError("must be longer than zero")
    if seconds > MAX_DURATION.total_seconds():
        raise ValueError(f"must be at most {format_duration(MAX_DURATION)}")
    return timedelta(seconds=seconds)


def format_duration(duration: timedelta) -> str:
    """The shortest spelling :func:`parse_duration` reads back (``timedelta(minutes=90)`` → ``1h30m``)."""
    seconds = int(duration.total_seconds())
    parts = []
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(parts) or "0s"


def zone(name: str) -> ZoneInfo:
    """The IANA time zone ``name``; ValueError when it is unknown."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: "US" is a directory of zones
        raise ValueError(f"unknown time zone {name!r} (use an IANA name such as Europe/Paris)") from None


def interval_trigger(every: timedelta) -> IntervalTrigger:
    """Fires every ``every`` (whole seconds), at multiples of it since the epoch, in UTC."""
    if every.total_seconds() < 1 or every.total_seconds() != int(every.total_seconds()):
        raise ValueError("must be a whole number of seconds, at least 1s")
    return IntervalTrigger(seconds=int(every.total_seconds()), start_date=EPOCH, timezone=UTC)


def _day(token: str) -> int:
    if token.isdigit() and int(token) <= 7:
        return int(token)
    if token in _DAYS:
        return _DAYS.index(token)
    raise ValueError(f"day of week {token!r} is not 0-7 or sun-sat")


def _weekdays(field: str) -> str:
    """A crontab day-of-week field (0 or 7 = Sunday) as APScheduler 3 day names."""
    days: set[int] = set()
    for part in field.split(","):
        body, _, step_text = part.partition("/")
        step = int(step_text) if step_text else 1
        if step < 1:
            raise ValueError("a step must be at least 1")
        if body == "*":
            first, last = 0, 6
        elif "-" in body:
            first, last = (_day(t) for t in body.split("-", 1))
        else:
            first = _day(body)
            last = 6 if step_text else first
        if first > last:
            raise ValueError(f"day-of-week range {body!r} runs backwards")
        days.update(d % 7 for d in range(first, last + 1, step))
    if len(days) == 7:
        return "*"
    # APScheduler 3 counts from Monday; its names are unambiguous.
    return ",".join(_DAYS[d] for d in sorted(days, key=lambda d: (d + 6) % 7))


#: Every month and day of the month that exist together come round within eight years (29 February:
#: 2096, then 2104), so a cron trigger with no fire time within this span never fires.
_RECURRENCE = timedelta(days=9 * 366)


def _fires_before(trigger: CronTrigger, now: datetime, end: datetime) -> bool:
    """Whether ``trigger`` fires between ``now`` and ``end``. Asked without an end, APScheduler
    searches up to the year 9999 for a date that never occurs: about a second of CPU per
    expression (the scheduler's start, ``jobctl`` checks); a copy with an end date stops early."""
    probe = copy.copy(trigger)
    probe.end_date = end
    return probe.get_next_fire_time(None, now) is not None


class CronSchedule(BaseTrigger):  # type: ignore[misc]
    """A standard five-field crontab expression (or ``@daily``-style macro) in a time zone."""

    def __init__(self, expression: str, timezone: str = "UTC") -> None:
        self.expression = expression
        self.timezone: tzinfo = zone(timezone)
        self.timezone_name = timezone
        fields = _MACROS.get(expression.strip().lower(), expression).lower().split()
        if len(fields) != 5:
            raise ValueError(
                f"has {len(fields)} fields; standard cron has 5 (minute hour day-of-month month day-of-week)"
            )
        for name, pattern, field in zip(_FIELD_NAMES, _PATTERNS, fields, strict=True):
            if not pattern.match(field):
                raise ValueError(f"{name} field {field!r} is not standard cron syntax")
        minute, hour, day, month, weekday = fields
        weekdays = _weekdays(weekday)
        # crontab: when both day fields are restricted, either one matching is enough.
        if day.startswith("*") or weekday.startswith("*"):
            days = [(day, weekdays)]
        else:
            days = [(day, "*"), ("*", weekdays)]
        # crontab's "fixed-time" jobs run once per wall-clock time; "wildcard" ones at each instant
        # their wall-clock time occurs (see scheduler.wall_clock).
        self._once_per_wall_time = not (minute.startswith("*") or hour.startswith("*"))
        # Times are searched on the wall clock: triggers in UTC, which has no changes.
        try:
            triggers = [
                CronTrigger(minute=minute, hour=hour, day=d, month=month, day_of_week=w, timezone=UTC)
                for d, w in days
            ]
        except ValueError as exc:
            raise ValueError(str(exc)) from None
        # APScheduler takes dates that never occur (``0 0 30 2 *``) and finds no fire time, each
        # time after a search through the years: refuse them, and drop a half that never fires.
        now = datetime.now(UTC)
        self._triggers = [t for t in triggers if _fires_before(t, now, now + _RECURRENCE)]
        if not self._triggers:
            raise ValueError("never fires: no date matches its day-of-month and month")

    def get_next_fire_time(self, previous_fire_time: datetime | None, now: datetime) -> datetime | None:
        low = _utc(now)
        if previous_fire_time is not None:
            low = max(low, _utc(previous_fire_time) + timedelta(microseconds=1))
        return next_fire(self._triggers, self.timezone, low, fixed=self._once_per_wall_time)

    def __str__(self) -> str:
        return f"cron[{self.expression} {self.timezone_name}]"

    def __repr__(self) -> str:
        return f"<CronSchedule {self.expression!r} {self.timezone_name}>"


def next_fires(trigger: BaseTrigger, after: datetime, count: int) -> Iterator[datetime]:
    """The first ``count`` fire times at or after ``after``."""
    fire = trigger.get_next_fire_time(None, after)
    for _ in range(count):
        if fire is None:
            return
        yield fire
        fire = trigger.get_next_fire_time(fire, fire)


def fires_between(trigger: BaseTrigger, start: datetime, end: datetime) -> Iterator[datetime]:
    """Fire times ``t`` with ``start < t <= end``, in order."""
    fire = trigger.get_next_fire_time(None, start)
    while fire is not None and _utc(fire) <= _utc(end):
        if _utc(fire) > _utc(start):
            yield fire
        fire = trigger.get_next_fire_time(fire, fire)


def _utc(moment: datetime) -> datetime:
    return moment.astimezone(UTC)
