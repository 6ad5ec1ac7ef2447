"""Prometheus counts, levels and timings gathered in-process and applied to the instruments in batches.

In multiprocess mode every ``inc()``/``observe()`` of prometheus_client takes a lock and writes the
new value into the process's memory-mapped sample file; a job touched four of them. Here worker
threads only add to a dictionary under one lock; a background thread applies the sums every
``interval`` seconds (one write per series instead of one per job), and :meth:`Tally.flush` applies
them at once (at shutdown, and in tests). A scrape therefore lags the jobs by at most ``interval``;
nothing is lost or counted twice: each sum is taken out under the lock before it is applied.
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections.abc import Sequence
from typing import Any

__all__ = ["Tally"]

logger = logging.getLogger(__name__)

#: A series: the metric (a prometheus_client parent) and its label values.
Series = tuple[Any, tuple[str, ...]]


class _Timings:
    """Observations of one histogram series: count per bucket (not cumulative) and their sum."""

    __slots__ = ("counts", "total")

    def __init__(self, buckets: int) -> None:
        self.counts = [0] * buckets
        self.total = 0.0


class Tally:
    """Add from any thread; applied to the instruments by one thread every ``interval`` seconds.

    Parameters:
      interval: seconds between two applications of what was added.
    """

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self._lock = threading.Lock()
        self._counts: dict[Series, float] = {}
        self._levels: dict[Series, float] = {}
        self._changed_levels: set[Series] = set()
        self._timings: dict[Series, _Timings] = {}
        self._bounds: dict[int, Sequence[float]] = {}
        self._applying = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def count(self, counter: Any, labels: tuple[str, ...], amount: float = 1.0) -> None:
        """Add ``amount`` to ``counter`` for ``labels``."""
        with self._lock:
            self._add_count((counter, labels), amount)

    def level(self, gauge: Any, labels: tuple[str, ...], change: float) -> None:
        """Move the gauge ``gauge`` (a level this process owns, such as jobs in progress) by ``change``."""
        with self._lock:
            self._add_level((gauge, labels), change)

    def observe(self, histogram: Any, labels: tuple[str, ...], value: float) -> None:
        """Note one observation of ``histogram`` for ``labels``."""
        index, buckets = self._bucket(histogram, value)
        with self._lock:
            self._add_timing((histogram, labels), index, buckets, value)

    def finished(
        self, labels: tuple[str, ...], *, gauge: Any, histogram: Any, value: float, counter: Any
    ) -> None:
        """One job of ``labels`` done, under one lock acquisition: ``gauge`` (its level) down by
        one, ``value`` observed in ``histogram``, ``counter`` up by one."""
        index, buckets = self._bucket(histogram, value)
        with self._lock:
            self._add_level((gauge, labels), -1.0)
            self._add_timing((histogram, labels), index, buckets, value)
            self._add_count((counter, labels), 1.0)

    def _bucket(self, histogram: Any, value: float) -> tuple[int, int]:
        """The index of the first bound of ``histogram`` at or above ``value``, and its bucket count."""
        bounds = self._bounds.get(id(histogram))
        if bounds is None:
            bounds = self._bounds.setdefault(id(histogram), tuple(histogram._upper_bounds))
        return min(bisect.bisect_left(bounds, value), len(bounds) - 1), len(bounds)

    # The additions themselves; the caller holds the lock.

    def _add_count(self, series: Series, amount: float) -> None:
        self._counts[series] = self._counts.get(series, 0.0) + amount

    def _add_level(self, series: Series, change: float) -> None:
        self._levels[series] = self._levels.get(series, 0.0) + change
        self._changed_levels.add(series)

    def _add_timing(self, series: Series, index: int, buckets: int, value: float) -> None:
        timings = self._timings.get(series)
        if timings is None:
            timings = self._timings[series] = _Timings(buckets)
        timings.counts[index] += 1
        timings.total += value

    def flush(self) -> None:
        """Apply everything added so far to the instruments."""
        with self._applying:
            with self._lock:
                counts, self._counts = self._counts, {}
                levels = {s: self._levels[s] for s in self._changed_levels}
                self._changed_levels = set()
                timings, self._timings = self._timings, {}
            for (counter, labels), amount in counts.items():
                counter.labels(*labels).inc(amount)
            for (gauge, labels), value in levels.items():
                gauge.labels(*labels).set(value)
            for (histogram, labels), observed in timings.items():
                child = histogram.labels(*labels)
                for bucket, count in zip(child._buckets, observed.counts, strict=True):
                    if count:
                        bucket.inc(count)
                child._sum.inc(observed.total)

    def start(self) -> None:
        """Apply what was added every ``interval`` seconds on a background thread, until :meth:`stop`."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="metrics-tally", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the background thread and apply what is left."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.interval * 2 + 5)
        self.flush()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.flush()
            except Exception:
                logger.exception("metrics_flush_failed")
