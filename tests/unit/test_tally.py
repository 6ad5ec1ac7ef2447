"""Metrics gathered in-process (jobsystem.runtime.tally): exact once applied, from many threads."""

from __future__ import annotations

import threading

import prometheus_client as prom
import pytest

from jobsystem.runtime.tally import Tally

BUCKETS = (5, 10, 25, 100, float("inf"))


def instruments() -> tuple[prom.CollectorRegistry, prom.Counter, prom.Gauge, prom.Histogram]:
    registry = prom.CollectorRegistry()
    labels = ["queue_name", "actor_name"]
    counter = prom.Counter("jobs", "Jobs.", labels, registry=registry)
    gauge = prom.Gauge("running", "Running.", labels, registry=registry)
    histogram = prom.Histogram("took", "Took.", labels, buckets=BUCKETS, registry=registry)
    return registry, counter, gauge, histogram


def value(registry: prom.CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, {"queue_name": "q", "actor_name": "a", **labels})


def test_counts_levels_and_timings_are_exact_after_a_flush():
    registry, counter, gauge, histogram = instruments()
    tally = Tally(interval=60)
    durations = [0.5, 5, 5.01, 10, 24.9, 99, 100, 250, 10_000]
    barrier = threading.Barrier(8)

    def work() -> None:
        barrier.wait()
        for i in range(1000):
            tally.count(counter, ("q", "a"))
            tally.level(gauge, ("q", "a"), 1)
            tally.observe(histogram, ("q", "a"), durations[i % len(durations)])
            tally.level(gauge, ("q", "a"), -1)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert value(registry, "jobs_total") is None  # nothing applied before the flush
    tally.flush()
    observed = [durations[i % len(durations)] for _ in range(8) for i in range(1000)]
    assert value(registry, "jobs_total") == 8000
    assert value(registry, "running") == 0
    assert value(registry, "took_count") == 8000
    assert value(registry, "took_sum") == pytest.approx(sum(observed))
    for bound in ("5.0", "10.0", "25.0", "100.0", "+Inf"):
        assert value(registry, "took_bucket", le=bound) == sum(1 for d in observed if d <= float(bound))
    tally.count(counter, ("q", "a"), 2)
    tally.flush()
    tally.flush()  # a second flush adds nothing more
    assert value(registry, "jobs_total") == 8002


def test_the_background_thread_applies_and_stop_applies_the_rest():
    registry, counter, gauge, _ = instruments()
    tally = Tally(interval=0.05)
    tally.start()
    tally.count(counter, ("q", "a"), 3)
    tally.level(gauge, ("q", "a"), 1)
    done = threading.Event()

    def applied() -> None:
        while value(registry, "jobs_total") != 3:
            threading.Event().wait(0.01)
        done.set()

    threading.Thread(target=applied, daemon=True).start()
    assert done.wait(10)
    assert value(registry, "running") == 1
    tally.count(counter, ("q", "a"), 4)
    tally.stop()
    assert value(registry, "jobs_total") == 7


def test_finished_is_the_level_the_observation_and_the_count_it_stands_for():
    registry, counter, gauge, histogram = instruments()
    tally = Tally(interval=60)
    for duration in (3, 30, 3_000):
        tally.level(gauge, ("q", "a"), 1)
        tally.finished(("q", "a"), gauge=gauge, histogram=histogram, value=duration, counter=counter)
    tally.level(gauge, ("q", "a"), 1)  # one still running
    tally.flush()
    assert value(registry, "jobs_total") == 3
    assert value(registry, "running") == 1
    assert value(registry, "took_count") == 3
    assert value(registry, "took_sum") == 3_033
    assert [value(registry, "took_bucket", le=b) for b in ("5.0", "25.0", "100.0", "+Inf")] == [1, 1, 2, 3]
