"""Which fires of a schedule to send now: the misfire policy, as a pure function of times.

The state store keeps each schedule's last sent fire. From it, whenever the leader looks at a
schedule (at each fire of its trigger, and when it becomes leader), the fires due since then are:

- older than ``misfire_grace``: skipped (logged), never sent late;
- due before this process started (no scheduler was running, or this one was not yet): only the
  latest is sent, once (coalesced), whatever the number of missed periods;
- due while this process ran, as leader or standby: each is sent. A standby taking over from a
  leader that died sends the fires of the take-over gap, so a take-over loses none; one that the
  old leader sent but had not recorded collides on its idempotency key and is dropped.

Fire times come from the trigger, never from the clock, so every replica names a fire alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from apscheduler.triggers.base import BaseTrigger

from scheduler.triggers import fires_between


@dataclass(frozen=True)
class FirePlan:
    """The fires to send, in order, and what was left out."""

    send: list[datetime] = field(default_factory=list)
    #: Fires due before the process started that were folded into the first one sent.
    coalesced: int = 0
    #: Whether fires since the last one sent were older than the grace and dropped.
    skipped: bool = False


def plan_fires(
    trigger: BaseTrigger,
    *,
    last: datetime | None,
    now: datetime,
    started_at: datetime,
    grace: timedelta,
) -> FirePlan:
    """The fires of ``trigger`` to send at ``now``, after ``last`` (None: never sent, or forgotten).

    A schedule that never fired does not make up for the time before the process started: its
    first fire is the first one due after the start.
    """
    horizon = now - grace
    since = last if last is not None else started_at
    skipped = False
    if since < horizon:
        first = next(fires_between(trigger, since, horizon), None)
        skipped = last is not None and first is not None and first < horizon
        since = horizon - timedelta(microseconds=1)  # a fire exactly ``grace`` old is still sent
    due = list(fires_between(trigger, since, now))
    before_start = [f for f in due if f <= started_at]
    after_start = [f for f in due if f > started_at]
    return FirePlan(
        send=before_start[-1:] + after_start,
        coalesced=max(len(before_start) - 1, 0),
        skipped=skipped,
    )
