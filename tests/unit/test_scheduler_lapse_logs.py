"""What the scheduler says as a term ends: a lapse it renewed at once is an INFO line, a lease
lost a WARNING naming the holder, and neither asks the state store while the lease's lock is held
(a store that hangs would hold up the renewals, and the catch-up of the term that follows)."""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import pytest
import structlog

import jobsystem.store.leader
import scheduler.service
from jobsystem.store.base import StateStore
from scheduler.service import LEADER_LEASE, Scheduler
from tests.unit.test_scheduler_checkins import Clock, RefusingBroker, leading_scheduler, utc


@pytest.fixture
def ticks(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    moment = [1_000.0]
    monkeypatch.setattr(jobsystem.store.leader, "time", SimpleNamespace(monotonic=lambda: moment[0]))
    Clock.install(monkeypatch, utc(2026, 1, 5, 9, 0, 1))
    return moment


def holder_lookups(sched: Scheduler, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether the lease's lock was held at each look-up of the holder in the store."""
    held: list[bool] = []
    lookup = sched.store.lease_holder

    def recorded(name: str) -> str | None:
        held.append(sched.lease._lock.locked())
        return lookup(name)

    monkeypatch.setattr(sched.store, "lease_holder", recorded)
    return held


def run_standby_report(sched: Scheduler) -> None:
    """Run the job ``_on_lost`` queued, as APScheduler's thread would."""
    job = sched.aps.get_job("standby")
    assert job is not None
    sched.aps.remove_job(job.id)
    job.func(*job.args)


@contextmanager
def scheduler_logs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[MutableMapping[str, Any]]]:
    """The scheduler's events meanwhile: its module logger, which an earlier test's logging
    set-up may have cached with that set-up's processors, is a fresh one made inside the capture."""
    with structlog.testing.capture_logs() as logged:
        monkeypatch.setattr(scheduler.service, "logger", structlog.get_logger("scheduler.service"))
        yield logged


def scheduler_lines(logged: list[MutableMapping[str, Any]]) -> list[tuple[str, str]]:
    return [(e["event"], e["log_level"]) for e in logged if e["event"].startswith("scheduler_")]


def test_a_lapse_renewed_at_once_is_an_info_line_and_asks_the_store_nothing(
    store: StateStore, ticks: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    sched = leading_scheduler(store, RefusingBroker(), started_at=utc(2026, 1, 5, 8, 59))
    held = holder_lookups(sched, monkeypatch)
    ticks[0] += 14.0  # paused past 90% of the lease's TTL: lapsed, and nobody took it
    with scheduler_logs(monkeypatch) as logged:
        assert sched.lease.poll()
    assert scheduler_lines(logged) == [("scheduler_lease_lapsed", "info"), ("scheduler_leader", "info")]
    assert held == []
    assert sched.aps.get_job("standby") is None


def test_a_lease_lost_to_another_is_a_warning_naming_it_looked_up_off_the_lease_lock(
    store: StateStore, ticks: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    sched = leading_scheduler(store, RefusingBroker(), started_at=utc(2026, 1, 5, 8, 59))
    held = holder_lookups(sched, monkeypatch)
    assert store.release_lease(LEADER_LEASE, sched.lease.owner)
    assert store.acquire_lease(LEADER_LEASE, "other", sched.settings.scheduler_lease_ms)
    ticks[0] += 6.0
    with scheduler_logs(monkeypatch) as logged:
        assert not sched.lease.poll()
        run_standby_report(sched)
    standby = [e for e in logged if e["event"] == "scheduler_standby"]
    assert [(e["log_level"], e["leader"], e["reason"]) for e in standby] == [
        ("warning", "other", "lease lost")
    ]
    assert held == [False]
