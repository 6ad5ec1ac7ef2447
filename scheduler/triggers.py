"""Fire times: standard crontab expressions in an IANA time zone, and fixed intervals.

Every replica of the scheduler must compute the *same* fire times, because a fire's idempotency
key is built from its scheduled time. So intervals are aligned to the Unix epoch (``every = "15m"``
fires at :00, :15, :30 and :45 UTC, whenever the process started) instead of APScheduler's
default of "now + interval", and cron times come from the expression and its time zone only.

APScheduler 3's cron trigger differs from standard cron in three ways, corrected here:

- day of week: 0 is Sunday in crontab (7 too), Monday in APScheduler 3;
- when both day of month and day of week are restricted, crontab fires when *either* matches
  (APScheduler requires both);
- on the autumn DST change a fixed time such as ``30 1 * * *`` occurs twice; crontab runs it once
  (the first time), APScheduler twice. Jobs whose minute or hour starts with ``*`` run by elapsed
  time, in both passes, as in crontab. A fixed time that does not exist on the spring change
  (``30 2 * * *`` in New York) fires once, at the same instant as before the change (03:30 EDT).

Fixed times are therefore found on the wall clock (a UTC trigger run over local times) and each
mapped to its instant with ``fold=0``: APScheduler 3 stepping through a zone skips a fixed time in
the gap when it reaches it from an earlier time of the same day (``0 1,2 * * *`` in New York) or
when the gap is at midnight (``0 0 * * *`` in Santiago, Havana, Beirut, Cairo: a day without a fire).
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

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
#: The largest change of a zone's UTC offset at once (DST: 30 minutes to 2 hours), with room.
_MAX_JUMP = timedelta(hours=3)


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
        # crontab's "fixed-time" jobs run once per wall-clock time; "wildcard" ones by elapsed time.
        self._once_per_wall_time = not (minute.startswith("*") or hour.startswith("*"))
        # Fixed times are searched on the wall clock: a trigger in UTC, which has no changes.
        clock = UTC if self._once_per_wall_time else self.timezone
        try:
            triggers = [
                CronTrigger(minute=minute, hour=hour, day=d, month=month, day_of_week=w, timezone=clock)
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
        if self._once_per_wall_time:
            return _next_wall_time(self._triggers, self.timezone, previous_fire_time, now)
        after, start = previous_fire_time, now
        while True:
            candidates = [_next_within_offset(t, after, start) for t in self._triggers]
            found = [c for c in candidates if c is not None]
            if not found:
                return None
            fire = _utc(min(found, key=_utc)).astimezone(self.timezone)
            # Compared in UTC: datetimes sharing a tzinfo compare by wall clock, ignoring ``fold``.
            too_early = previous_fire_time is not None and _utc(fire) <= _utc(previous_fire_time)
            if not too_early:
                return fire
            after, start = fire, fire

    def __str__(self) -> str:
        return f"cron[{self.expression} {self.timezone_name}]"

    def __repr__(self) -> str:
        return f"<CronSchedule {self.expression!r} {self.timezone_name}>"


def _next_wall_time(
    triggers: list[CronTrigger], zone: tzinfo, previous: datetime | None, now: datetime
) -> datetime | None:
    """The first instant at or after ``now`` (and after ``previous``) at which a wall-clock time of
    ``triggers`` (UTC triggers read as local times) occurs in ``zone``, each time once: a repeated
    time at its first pass, a skipped time at the instant it would have had before the change
    (``fold=0``). Only after a forward change can a wall-clock time's instant fall after a later
    one's (a skipped time, mapped past the gap), and by less than the gap: the search reaches that
    far either side, not more (a dense schedule, ``0-59 0-23 * * *``, reads each minute there)."""
    low = _utc(now) if previous is None else max(_utc(now), _utc(previous) + timedelta(microseconds=1))
    start = _wall(low, zone) - _forward_jump(zone, low)
    best: datetime | None = None
    limit = datetime.max
    wall = _next_wall(triggers, start)
    while wall is not None and wall <= limit:
        instant = _utc(wall.replace(tzinfo=zone))  # fold=0: the first pass, or the old offset in a gap
        if instant >= low and (best is None or instant < best):
            best = instant
            limit = wall + _forward_jump(zone, instant)
        wall = _next_wall(triggers, wall + timedelta(seconds=1))
    return None if best is None else best.astimezone(zone)


def _wall(moment: datetime, zone: tzinfo) -> datetime:
    """``moment``'s wall-clock time in ``zone``, naive."""
    return moment.astimezone(zone).replace(tzinfo=None, fold=0)


def _next_wall(triggers: list[CronTrigger], wall: datetime) -> datetime | None:
    """The first wall-clock time at or after naive ``wall`` that one of the UTC ``triggers`` names."""
    found = [t.get_next_fire_time(None, wall.replace(tzinfo=UTC)) for t in triggers]
    times = [f.replace(tzinfo=None) for f in found if f is not None]
    return min(times) if times else None


def _forward_jump(zone: tzinfo, moment: datetime) -> timedelta:
    """How far ``zone``'s clocks jump forward within :data:`_MAX_JUMP` of ``moment`` (the gap of
    wall-clock times it skips); zero without a change there, or for a change back."""
    before, after = (moment - _MAX_JUMP).astimezone(zone), (moment + _MAX_JUMP).astimezone(zone)
    jump = (after.utcoffset() or timedelta(0)) - (before.utcoffset() or timedelta(0))
    return max(jump, timedelta(0))


def _next_within_offset(trigger: CronTrigger, previous: datetime | None, now: datetime) -> datetime | None:
    """``trigger.get_next_fire_time(previous, now)``, without APScheduler 3's error across a UTC
    offset change: it steps a field by its wall-clock difference added in UTC, so a step over a
    spring-forward change lands an hour late and skips a fire (``0 0 * * *`` in New York skipped
    2024-03-11). When the fire found lies past a change, the search starts again at the change,
    and the earlier of the two fires is the one."""
    fire: datetime | None = trigger.get_next_fire_time(previous, now)
    origin = _utc(now if previous is None else min(now, previous))
    zone: tzinfo = trigger.timezone
    while fire is not None and origin.astimezone(zone).utcoffset() != fire.utcoffset():
        origin = _first_offset_change(zone, origin, _utc(fire))
        again: datetime | None = trigger.get_next_fire_time(None, origin)
        if again is not None and _utc(again) < _utc(fire):
            fire = again
    return fire


def _first_offset_change(zone: tzinfo, start: datetime, end: datetime) -> datetime:
    """The first whole second after ``start`` whose offset in ``zone`` is not ``start``'s (offsets
    change on whole seconds); there is one at or before ``end``."""
    before = start.astimezone(zone).utcoffset()
    low, high = math.floor(start.timestamp()), math.ceil(end.timestamp())
    while high - low > 1:
        middle = (low + high) // 2
        if datetime.fromtimestamp(middle, zone).utcoffset() == before:
            low = middle
        else:
            high = middle
    return datetime.fromtimestamp(high, UTC)


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
