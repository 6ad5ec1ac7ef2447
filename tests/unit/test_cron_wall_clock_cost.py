"""How much a fixed-time cron schedule searches near a DST change: its fire times are found on the
wall clock, and only a forward change (the gap's length, not a fixed 3 hours) widens the search."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from apscheduler.triggers.cron import CronTrigger

from scheduler.triggers import CronSchedule, next_fires

DENSE = "0-59 0-23 * * *"  # a fixed time every minute: every wall-clock minute is one to read


def trigger_calls_per_fire(monkeypatch: pytest.MonkeyPatch, tz: str, start: datetime, count: int) -> float:
    """The APScheduler trigger searches made per fire over ``count`` fires from ``start``."""
    calls = 0
    search = CronTrigger.get_next_fire_time

    def counted(self: CronTrigger, *args: Any) -> Any:
        nonlocal calls
        calls += 1
        return search(self, *args)

    schedule = CronSchedule(DENSE, tz)
    monkeypatch.setattr(CronTrigger, "get_next_fire_time", counted)
    fires = list(next_fires(schedule, start, count))
    monkeypatch.undo()
    assert len(fires) == count
    return calls / count


def test_a_change_back_costs_no_more_than_a_plain_day(monkeypatch):
    """Past a change back no wall-clock time's instant comes before an earlier one's: each fire
    is one search, not a 6-hour scan of every minute (352 searches a fire, 70 times slower)."""
    plain = trigger_calls_per_fire(monkeypatch, "America/New_York", datetime(2024, 3, 1, 4, tzinfo=UTC), 360)
    back = trigger_calls_per_fire(monkeypatch, "America/New_York", datetime(2024, 11, 3, 3, tzinfo=UTC), 360)
    assert plain <= 3 and back <= plain


@pytest.mark.parametrize(
    ("tz", "start", "gap_minutes"),
    [
        ("America/New_York", datetime(2024, 3, 10, 4, tzinfo=UTC), 60),
        ("Australia/Lord_Howe", datetime(2024, 10, 5, 12, tzinfo=UTC), 30),  # a 30-minute change
    ],
)
def test_a_change_forward_widens_the_search_by_its_gap_only(monkeypatch, tz, start, gap_minutes):
    """A skipped time maps past the gap, after later times' instants: the search reaches the
    gap's length of wall clock either side of a fire (it reached 3 hours either side)."""
    assert trigger_calls_per_fire(monkeypatch, tz, start, 360) <= 2 * gap_minutes + 4
