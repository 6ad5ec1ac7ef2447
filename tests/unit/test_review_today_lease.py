"""Review of today's merges, leases: the SQLite lease cut (fix/fixlease) takes a live holder's
lease when the processes disagree on its TTL, as they do while ``SCHEDULER_LEASE_MS`` is changed
in a rolling deploy (old replicas with the old TTL, new ones with the new).

The holder's TTL is recorded beside its lease, and a lease is cut by that TTL, not the asker's.
"""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_leader import WallClockStore


def test_a_standby_with_a_shorter_ttl_never_takes_a_lease_its_holder_renewed_in_time(tmp_path: Path) -> None:
    """``a`` renews with a 60 s TTL (it renews every 20 s and counts itself leader for 54 s);
    ``b``, started with 15 s, asks every 1.5 s. No clock went back: ``a``'s lease is valid for 60 s
    and ``b`` must not have it 16 s after ``a``'s renewal, which is before ``a`` renews again."""
    store = WallClockStore(tmp_path / "state.db")
    try:
        assert store.acquire_lease("leader", "a", 60_000)
        store.wall_ms += 1_000
        assert not store.acquire_lease("leader", "b", 15_000)
        store.wall_ms += 15_000
        taken = store.acquire_lease("leader", "b", 15_000)
        assert (taken, store.lease_holder("leader")) == (False, "a")
    finally:
        store.close()


def test_a_lease_left_ahead_by_a_clock_that_went_back_is_cut_to_its_holders_ttl(tmp_path: Path) -> None:
    """The clock steps back an hour and ``a`` (60 s) dies: ``b`` (15 s) cuts the lease to 60 s
    from the jump, ``a``'s own TTL, and takes it then, not an hour later nor 15 s later."""
    store = WallClockStore(tmp_path / "state.db")
    try:
        assert store.acquire_lease("leader", "a", 60_000)
        store.wall_ms -= 3_600_000
        assert not store.acquire_lease("leader", "b", 15_000)
        store.wall_ms += 60_000 - 1
        assert not store.acquire_lease("leader", "b", 15_000)
        store.wall_ms += 2
        assert store.acquire_lease("leader", "b", 15_000)
    finally:
        store.close()


def test_a_previous_release_lease_is_judged_by_the_askers_ttl_until_renewed_by_this_one(
    tmp_path: Path,
) -> None:
    """A row written without a TTL record (the previous release) is cut by the asker's TTL, as
    before; once its holder renews, its own TTL is recorded and a shorter one no longer cuts it.
    A release by another owner leaves the holder's record in place."""
    store = WallClockStore(tmp_path / "state.db")
    try:
        store.set("leader", "a", ttl_ms=3_600_000)  # as the previous release's acquire_lease wrote it
        assert not store.acquire_lease("leader", "b", 15_000)
        store.wall_ms += 15_001
        assert store.acquire_lease("leader", "b", 15_000)
        store.wall_ms += 1_000
        assert store.acquire_lease("leader", "b", 60_000)  # renewed with the new setting
        assert not store.release_lease("leader", "a")
        store.wall_ms += 16_000
        assert not store.acquire_lease("leader", "c", 15_000)
        assert store.lease_holder("leader") == "b"
    finally:
        store.close()
