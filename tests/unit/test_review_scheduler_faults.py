"""Review (faults, area 2): the scheduler is safe to run twice, and loses no fire to its lease.

In-process, as ``test_scheduler_checkins``: the test sets the wall clock of ``scheduler.service``
and the monotonic clock of the leader lease, and runs the fires APScheduler would run.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from apscheduler.triggers.date import DateTrigger

import jobsystem.store.leader
from jobsystem.store.base import StateStore
from scheduler.service import Scheduler
from tests.unit.test_scheduler_checkins import HOURLY, Clock, RefusingBroker, leading_scheduler, utc


def run_date_jobs(sched: Scheduler) -> None:
    """Run the one-off fires the scheduler queued (a catch-up after an election, a retry), as
    APScheduler would when their time came."""
    for job in sched.aps.get_jobs():
        if isinstance(job.trigger, DateTrigger):
            sched.aps.remove_job(job.id)
            job.func(*job.args)


def test_a_fire_refused_while_the_lease_had_lapsed_is_sent_once_the_process_leads_again(
    store: StateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leader is paused 14 s (a VM migration, SIGSTOP, a laptop asleep: the lease's 15 s TTL
    counts itself lapsed after 13.5 s) across the 10:00 fire. On waking, APScheduler runs the due
    fire at once: the process does not count itself leader, so ``fire`` returns. The lease thread
    then takes the lease again (no one else did): to ``LeaderLease`` it never stopped leading, so
    no election, no catch-up. The 10:00 fire is only looked at again at 11:00, past its 5-minute
    grace: skipped for good, though this process led all along and no other ever did."""
    ticks = [1_000.0]
    monkeypatch.setattr(jobsystem.store.leader, "time", SimpleNamespace(monotonic=lambda: ticks[0]))
    Clock.install(monkeypatch, utc(2026, 1, 5, 9, 0, 1))
    broker = RefusingBroker()
    broker.refusing = False
    sched = leading_scheduler(store, broker, started_at=utc(2026, 1, 5, 8, 59))
    run_date_jobs(sched)  # the catch-up of the election: sends 09:00
    assert broker.sent == ["2026-01-05T09:00:00Z"]

    ticks[0] += 14.0  # paused past 90% of the lease's TTL
    Clock.moment = utc(2026, 1, 5, 10, 0, 14)
    sched.fire(HOURLY.id)  # APScheduler's run of the 10:00 fire, first thing on waking
    ticks[0] += 0.05
    assert sched.lease.poll()  # the lease thread, right after: the lease is this process's again
    run_date_jobs(sched)
    Clock.moment = utc(2026, 1, 5, 11, 0, 1)
    sched.fire(HOURLY.id)  # the 11:00 fire

    assert broker.sent == ["2026-01-05T09:00:00Z", "2026-01-05T10:00:00Z", "2026-01-05T11:00:00Z"]
