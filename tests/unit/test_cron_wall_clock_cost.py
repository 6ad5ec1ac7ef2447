"""How much a cron schedule searches near a DST change: its fire times are found on the wall clock,
and a change costs about what a plain day does (a few APScheduler searches a fire), because a
skipped time is looked for in the gap itself, not by reading the wall clock around each fire."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from apscheduler.triggers.cron import CronTrigger

from scheduler.triggers import CronSchedule, next_fires

DENSE = "0-59 0-23 * * *"  # a fixed time every minute: every wall-clock minute is one to read


def trigger_calls_per_fire(
    monkeypatch: pytest.MonkeyPatch, tz: str, start: datetime, count: int, expression: str = DENSE
) -> float:
    """The APScheduler trigger searches made per fire over ``count`` fires from ``start``."""
    calls = 0
    search = CronTrigger.get_next_fire_time

    def counted(self: CronTrigger, *args: Any) -> Any:
        nonlocal calls
        calls += 1
        return search(self, *args)

    schedule = CronSchedule(expression, tz)
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
    ("tz", "start"),
    [
        ("America/New_York", datetime(2024, 3, 10, 4, tzinfo=UTC)),
        ("Australia/Lord_Howe", datetime(2024, 10, 5, 12, tzinfo=UTC)),  # a 30-minute change
    ],
)
@pytest.mark.parametrize("expression", [DENSE, "* * * * *"])
def test_a_change_forward_costs_about_as_much_as_a_plain_day(monkeypatch, tz, start, expression):
    """A skipped time's instant can come before an earlier time's only just past the gap: the
    gap is searched once for it (scanning a gap's length of wall clock either side of each fire
    cost 112 searches a fire in New York, 55 at Lord Howe)."""
    assert trigger_calls_per_fire(monkeypatch, tz, start, 360, expression) <= 2
