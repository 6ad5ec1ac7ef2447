"""State store races between processes, on each backend: one claim wins, one bucket is shared.

Each racer is a process of its own (spawned), started together on a barrier.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from jobsystem.store import StateStore, open_store
from jobsystem.store.buckets import TakeRequest, bucket_backend
from jobsystem.store.idempotency import idempotency_backend
from jobsystem.store.redis import RedisStore
from tests.support import fresh_store
from tests.unit.test_ratelimit_store import conforms


@pytest.fixture(params=["redis", "sqlite"])
def state_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StateStore]:
    with fresh_store(request.param, tmp_path) as state:
        yield state


def race(store: StateStore, target: Callable[..., None], racers: int) -> list[Any]:
    """Run ``target(url, namespace, barrier, out)`` in ``racers`` processes; what each put in ``out``."""
    url = store.url if isinstance(store, RedisStore) else f"sqlite:///{store.path}"  # type: ignore[attr-defined]
    namespace = store.namespace if isinstance(store, RedisStore) else ""
    ctx = multiprocessing.get_context("spawn")
    # All start together: each waits at the barrier until every process is up.
    start, out = ctx.Barrier(racers, timeout=60), ctx.Queue()
    procs = [ctx.Process(target=target, args=(url, namespace, start, out)) for _ in range(racers)]
    for p in procs:
        p.start()
    results = [out.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(10)
    return results


def _claim(url: str, namespace: str, start: Any, out: Any) -> None:
    keys = idempotency_backend(open_store(url, namespace=namespace))
    start.wait()
    out.put(keys.claim("a:procs", "m", multiprocessing.current_process().name, 10_000, 60_000).status)


def test_one_claim_wins_among_processes(state_store):
    assert sorted(race(state_store, _claim, 6)) == ["claimed"] + ["held"] * 5


def _take(url: str, namespace: str, start: Any, out: Any) -> None:
    buckets = bucket_backend(open_store(url, namespace=namespace))
    start.wait()
    out.put([buckets.take(TakeRequest("b", 50, 2, 1, 60_000)).at_ms for _ in range(10)])


def test_racing_processes_share_one_bucket(state_store):
    slots = [slot for taken in race(state_store, _take, 4) for slot in taken]
    assert len(slots) == 40 and conforms(slots, rate=50, burst=2)
    # 40 tokens at 50/s from a bucket of 2: the last slot is 38 intervals after the first.
    assert max(slots) - min(slots) >= 38 * 20 - 1
