"""The leader lease on each state store backend: one leader, take-over after a crash, step-down
when the store is unreachable, a lapse renewed by the holder is a new term, and SQLite leases
are taken over one TTL after the clock went back."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

import jobsystem.store.leader
from jobsystem.store.base import StateStore, StoreUnavailable
from jobsystem.store.leader import LeaderLease
from jobsystem.store.sqlite import SqliteStore
from tests.support import wait_for

#: Short enough to keep the unit tier fast, long enough that a loaded machine (a renewal due every
#: third of it, so a renewal late by two thirds of it) does not lose the lease to the standby.
TTL_MS = 500


def lease(store, events: list[str], name: str) -> LeaderLease:
    return LeaderLease(
        store,
        "leader",
        ttl_ms=TTL_MS,
        owner=name,
        on_elected=lambda: events.append(f"{name}+"),
        on_lost=lambda: events.append(f"{name}-"),
    )


def recording_polls(leader: LeaderLease) -> list[bool]:
    """Record the outcome of each attempt ``leader`` makes to take or renew its lease."""
    outcomes: list[bool] = []
    poll = leader.poll

    def recorded() -> bool:
        outcomes.append(poll())
        return outcomes[-1]

    leader.poll = recorded  # type: ignore[method-assign]
    return outcomes


def test_one_leader_and_a_take_over_within_the_ttl_after_a_crash(store):
    events: list[str] = []
    first, second = lease(store, events, "a"), lease(store, events, "b")
    renewals, attempts = recording_polls(first), recording_polls(second)
    first.start()
    wait_for(lambda: first.is_leader, what="the first election")
    second.start()
    # Not a sleep: wait until the standby has tried several times and the leader renewed since.
    renewed_before = len(renewals)
    wait_for(lambda: len(attempts) >= 5 and len(renewals) >= renewed_before + 3, what="renewals and attempts")
    assert not any(attempts) and all(renewals)  # the standby never got it, the leader never lost it
    assert first.is_leader and not second.is_leader
    assert store.lease_holder("leader") == "a"

    first.stop(release=False)  # a crash: the lease is not given back, it lapses
    crashed = time.monotonic()
    wait_for(lambda: second.is_leader, timeout=10, what="the take-over")
    # The bound the scheduler relies on: at most one TTL plus a standby's attempt period, plus
    # slack for a loaded machine.
    assert time.monotonic() - crashed < TTL_MS * 1.1 / 1000 + 1.5
    assert store.lease_holder("leader") == "b"

    second.stop()  # a clean stop gives the lease back at once
    assert store.lease_holder("leader") is None
    assert events == ["a+", "a-", "b+", "b-"]


class FlakyStore(SqliteStore):
    """A SQLite store that can be made unreachable."""

    down = False

    def acquire_lease(self, name: str, owner: str, ttl_ms: int) -> bool:
        if self.down:
            raise StoreUnavailable("sqlite: down for the test")
        return super().acquire_lease(name, owner, ttl_ms)


def test_a_leader_that_cannot_renew_steps_down_before_its_lease_lapses(tmp_path):
    store = FlakyStore(tmp_path / "state.db")
    events: list[tuple[str, str | None]] = []
    leader = LeaderLease(
        store,
        "leader",
        ttl_ms=1_500,  # a 150 ms margin between the step-down and the lapse
        owner="a",
        on_elected=lambda: events.append(("elected", None)),
        # Who holds the lease in the store at the moment this process steps down.
        on_lost=lambda: events.append(("lost", store.lease_holder("leader"))),
    )
    leader.start()
    wait_for(lambda: leader.is_leader, what="the election")
    store.down = True
    wait_for(lambda: len(events) == 2, timeout=10, what="the step-down")
    # It stepped down while its lease still held in the store: nobody else could lead yet.
    assert events == [("elected", None), ("lost", "a")]
    store.down = False
    wait_for(lambda: leader.is_leader, timeout=10, what="the re-election")
    leader.stop()
    assert [e for e, _ in events] == ["elected", "lost", "elected", "lost"]


class RenewalWithAPause:
    """A state store whose next lease call first runs ``during`` (the process paused mid-renewal,
    another thread looking at the lease meanwhile)."""

    def __init__(self, store: StateStore) -> None:
        self.store = store
        self.during: Callable[[], None] | None = None

    def acquire_lease(self, name: str, owner: str, ttl_ms: int) -> bool:
        during, self.during = self.during, None
        if during is not None:
            during()
        return self.store.acquire_lease(name, owner, ttl_ms)

    def release_lease(self, name: str, owner: str) -> bool:
        return self.store.release_lease(name, owner)


def monotonic_set_by_the_test(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    ticks = [1_000.0]
    monkeypatch.setattr(jobsystem.store.leader, "time", SimpleNamespace(monotonic=lambda: ticks[0]))
    return ticks


def test_a_lease_that_lapsed_between_two_renewals_is_a_new_term(
    store: StateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Renewed in time, the lease stays one term; renewed after it lapsed (a 0.5 s pause against
    its 0.45 s of validity), even by the same process and with no one else in between, it is a
    new term: the work refused in the gap is caught up by ``on_elected``."""
    ticks = monotonic_set_by_the_test(monkeypatch)
    events: list[str] = []
    leader = lease(store, events, "a")
    assert leader.poll()
    ticks[0] += TTL_MS / 3000
    assert leader.poll()
    assert events == ["a+"]
    ticks[0] += TTL_MS / 1000
    assert leader.poll()
    assert events == ["a+", "a-", "a+"]


def test_a_lapse_seen_by_a_caller_during_a_slow_renewal_is_a_new_term(
    store: StateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The renewal starts in time but its store call ends past the lease's validity; a fire looked
    in between and was refused. The renewal counts from its start, so the lease is valid again
    and the lease thread never sees the gap: only the caller did, and that must end the term."""
    ticks = monotonic_set_by_the_test(monkeypatch)
    events: list[str] = []
    paused = RenewalWithAPause(store)
    leader = lease(cast(StateStore, paused), events, "a")
    assert leader.poll()
    seen: list[bool] = []

    def paused_past_the_validity() -> None:
        ticks[0] += TTL_MS * 0.3 / 1000  # a whole TTL since the last renewal: lapsed
        seen.append(leader.is_leader)  # a fire, refused

    ticks[0] += TTL_MS * 0.7 / 1000
    paused.during = paused_past_the_validity
    assert leader.poll()  # valid until 0.7 + 0.9 TTL: the lease thread sees no lapse itself
    assert seen == [False]
    assert events == ["a+", "a-", "a+"]


class WallClockStore(SqliteStore):
    """A SQLite store whose wall clock the test sets."""

    wall_ms = 1_767_600_000_000

    def now_ms(self) -> int:
        return self.wall_ms


def test_a_sqlite_lease_lapses_one_ttl_after_the_clock_went_back_not_the_jump_later(tmp_path: Path) -> None:
    """SQLite leases expire by wall time. The clock steps back an hour (NTP) and the holder dies:
    the standby takes over one TTL after it sees the jump, not an hour later; and the cut does
    not let it in while a live holder keeps renewing."""
    store = WallClockStore(tmp_path / "state.db")
    ttl = 15_000
    assert store.acquire_lease("leader", "a", ttl)
    store.wall_ms -= 3_600_000  # and "a" dies
    assert not store.acquire_lease("leader", "b", ttl)  # the jump seen: cut to one TTL from now
    store.wall_ms += ttl - 1
    assert not store.acquire_lease("leader", "b", ttl)
    store.wall_ms += 2
    assert store.acquire_lease("leader", "b", ttl)

    store.wall_ms -= 3_600_000  # "b" lives on
    assert not store.acquire_lease("leader", "c", ttl)
    store.wall_ms += ttl // 3
    assert store.acquire_lease("leader", "b", ttl)  # renewed as usual
    store.wall_ms += ttl - 1  # past the cut, within the renewal
    assert not store.acquire_lease("leader", "c", ttl)
    assert store.lease_holder("leader") == "b"
    store.close()
