"""Tokens a worker process took on lease from its rate-limit buckets, handed to its threads
without a store round trip (see ``jobsystem.store.buckets`` for when a lease is granted and why
the burst bound still holds).

A lease is good until its end, measured on this process's monotonic clock from *before* the take
was sent, so it ends here no later than the store ends it. What is left at the end, or when the
process stops, or when an upstream says "slow down", is dropped rather than given back: giving
back would need a round trip and could only under-use the bucket less; dropping under-uses it by
at most one lease per process and lease period, and never lets it exceed its bound.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass

__all__ = ["LeaseTally", "TokenLeases"]


@dataclass
class LeaseTally:
    """Tokens received on lease, spent from leases, and dropped unspent, since the process started."""

    leased: float = 0.0
    spent: float = 0.0
    dropped: float = 0.0


class TokenLeases:
    """Leased tokens per bucket, for any thread of this process; at most ``max_buckets`` buckets
    (the least recently used one is dropped first), so per-key buckets cannot grow it without bound."""

    def __init__(self, max_buckets: int = 1_024) -> None:
        if max_buckets < 1:
            raise ValueError("max_buckets must be at least 1")
        self.max_buckets = max_buckets
        self.tally = LeaseTally()
        # bucket -> leases as [tokens, end] (monotonic seconds), the one ending first at the left.
        self._held: OrderedDict[str, deque[list[float]]] = OrderedDict()
        self._lock = threading.Lock()

    def spend(self, bucket: str, cost: float, now: float | None = None) -> bool:
        """Take ``cost`` tokens from ``bucket``'s leases; False (nothing taken) when they hold fewer."""
        now = time.monotonic() if now is None else now
        with self._lock:
            leases = self._held.get(bucket)
            if leases is None:
                return False
            while leases and (leases[0][1] <= now or leases[0][0] < cost):
                self.tally.dropped += leases.popleft()[0]  # ended, or too little left for a job
            if not leases:
                del self._held[bucket]
                return False
            leases[0][0] -= cost
            self.tally.spent += cost
            self._held.move_to_end(bucket)
            return True

    def add(self, bucket: str, tokens: float, end: float) -> None:
        """Hold ``tokens`` leased from ``bucket`` until ``end`` (monotonic seconds)."""
        with self._lock:
            self.tally.leased += tokens
            leases = self._held.get(bucket)
            if leases is None:
                leases = self._held[bucket] = deque()
                while len(self._held) > self.max_buckets:
                    self._drop(next(iter(self._held)))
            if leases and leases[-1][1] >= end:  # ends no later than the last: one lease, its end
                leases[-1][0] += tokens
                leases[-1][1] = end
            else:
                leases.append([tokens, end])
            self._held.move_to_end(bucket)

    def drop(self, bucket: str | None = None) -> None:
        """Drop what is held for ``bucket`` (None: for every bucket)."""
        with self._lock:
            for name in list(self._held) if bucket is None else [bucket]:
                self._drop(name)

    def _drop(self, bucket: str) -> None:
        leases = self._held.pop(bucket, None)
        self.tally.dropped += sum(tokens for tokens, _ in leases or ())

    def held(self, bucket: str) -> float:
        """The tokens held for ``bucket`` now (ended leases included until next spent from)."""
        with self._lock:
            return sum(tokens for tokens, _ in self._held.get(bucket, ()))
