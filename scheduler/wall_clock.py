"""Cron fire instants read off a time zone's wall clock, across its DST changes, as crontab runs them.

Every fire time is first found as a wall-clock time (naive), by APScheduler cron triggers in UTC,
which has no changes; each is then placed in the zone. crontab places them in two ways:

- *fixed* times (neither minute nor hour starts with ``*``) run once per wall-clock time: a time
  repeated when clocks go back at its first pass, a time skipped when they go forward at the
  instant it would have had before the change (``fold=0``: ``30 2 * * *`` in New York at 03:30
  EDT on the spring change day);
- *wildcard* times run at every instant whose wall-clock time matches: in both passes of a
  repeated hour, and not at all in a skipped one (``0 */2 * * *`` in New York on 2026-03-08:
  00:00 EST, then 04:00 EDT, no fire at 03:00 EDT).

A change is found only near the instant searched from, or near a wall-clock time that does not
exist: a skipped time's instant can come before an earlier time's only within the gap's length
after the change, and a repeated time can come round again only within the repeat's length
before it. So each fire costs a few trigger searches, change or not, where scanning the wall clock
a gap's length either side cost a search per matching minute there (120 for ``0-59 0-23 * * *``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo

from apscheduler.triggers.cron import CronTrigger

#: The largest change of a zone's UTC offset at once (DST: 30 minutes to 2 hours), with room.
MAX_JUMP = timedelta(hours=3)
#: How many skipped hours in a row a wildcard search steps over before it gives up (never reached:
#: a zone has one gap a season, and an expression matching only in gaps is refused as never firing).
_MAX_GAPS = 16


@dataclass(frozen=True)
class Change:
    """A change of a zone's UTC offset at instant ``at``."""

    at: datetime
    before: timedelta
    after: timedelta

    @property
    def old_wall(self) -> datetime:
        """Where the old clock stops: the gap's start (forward) or the repeat's end (back)."""
        return (self.at + self.before).replace(tzinfo=None)

    @property
    def new_wall(self) -> datetime:
        """Where the new clock starts: the gap's end (forward) or the repeat's start (back)."""
        return (self.at + self.after).replace(tzinfo=None)

    @property
    def jump(self) -> timedelta:
        """How far clocks move: positive forward (the gap's length), negative back."""
        return self.after - self.before


def next_fire(
    triggers: Sequence[CronTrigger], zone: tzinfo, low: datetime, *, fixed: bool
) -> datetime | None:
    """The first fire at or after instant ``low`` of the wall-clock times ``triggers`` name (UTC
    triggers read as local times) in ``zone``; ``fixed``: placed as crontab's fixed times."""
    found = _next_fixed(triggers, zone, low) if fixed else _next_wildcard(triggers, zone, low)
    return None if found is None else found.astimezone(zone)


def _next_fixed(triggers: Sequence[CronTrigger], zone: tzinfo, low: datetime) -> datetime | None:
    start = wall(low, zone)
    if low.astimezone(zone).fold:  # the second pass of a repeat: its times ran at their first
        back = change_within(zone, low - MAX_JUMP, low)
        start = back.old_wall if back is not None else start
    time = next_wall(triggers, start)
    if time is None:
        return None
    found = [_first_instant(time, zone)]
    gap = _gap_of(time, zone)
    if gap is not None:  # skipped: its instant is past the gap, where later times may come first
        after = next_wall(triggers, gap.new_wall)
        found += [] if after is None else [_first_instant(after, zone)]
    forward = change_within(zone, low - MAX_JUMP, low)
    if forward is not None and forward.jump > timedelta(0) and start < forward.new_wall + forward.jump:
        # Just past a gap: its skipped times fall at or after ``low``, before later times.
        skipped = next_wall(triggers, max(forward.old_wall, start - forward.jump))
        if skipped is not None and skipped < forward.new_wall:
            found.append(_first_instant(skipped, zone))
    return min(found)


def _next_wildcard(triggers: Sequence[CronTrigger], zone: tzinfo, low: datetime) -> datetime | None:
    time = next_wall(triggers, wall(low, zone))
    for _ in range(_MAX_GAPS):
        gap = None if time is None else _gap_of(time, zone)
        if gap is None:
            break
        time = next_wall(triggers, gap.new_wall)  # a skipped time does not run
    if time is None or _gap_of(time, zone) is not None:
        return None
    found = [i for i in _instants(time, zone) if i >= low]
    back = change_within(zone, low, low + MAX_JUMP)
    if back is not None and back.jump < timedelta(0):
        # Clocks go back ahead: the repeated times before ``time`` run again in the second pass.
        again = next_wall(triggers, back.new_wall)
        if again is not None and again < back.old_wall:
            found += [i for i in _instants(again, zone) if i >= low]
    return min(found)


def wall(moment: datetime, zone: tzinfo) -> datetime:
    """``moment``'s wall-clock time in ``zone``, naive."""
    return moment.astimezone(zone).replace(tzinfo=None, fold=0)


def next_wall(triggers: Sequence[CronTrigger], time: datetime) -> datetime | None:
    """The first wall-clock time at or after naive ``time`` that one of the UTC ``triggers`` names."""
    found = [t.get_next_fire_time(None, time.replace(tzinfo=UTC)) for t in triggers]
    times = [f.replace(tzinfo=None) for f in found if f is not None]
    return min(times) if times else None


def _first_instant(time: datetime, zone: tzinfo) -> datetime:
    """The instant of naive ``time`` at its first pass; a skipped time's as before the change."""
    return time.replace(tzinfo=zone, fold=0).astimezone(UTC)


def _instants(time: datetime, zone: tzinfo) -> list[datetime]:
    """The instants at which naive ``time`` is the wall-clock time: one, or two when repeated."""
    return sorted({time.replace(tzinfo=zone, fold=fold).astimezone(UTC) for fold in (0, 1)})


def _gap_of(time: datetime, zone: tzinfo) -> Change | None:
    """The forward change that skips naive ``time``, or None when ``time`` exists."""
    instant = _first_instant(time, zone)
    if wall(instant, zone) == time:
        return None
    return change_within(zone, instant - MAX_JUMP, instant)


def change_within(zone: tzinfo, start: datetime, end: datetime) -> Change | None:
    """The change of ``zone``'s offset between instants ``start`` and ``end`` (at most one there)."""
    before, after = start.astimezone(zone).utcoffset(), end.astimezone(zone).utcoffset()
    if before is None or after is None or before == after:
        return None
    return Change(_first_offset_change(zone, start, end), before, after)


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
