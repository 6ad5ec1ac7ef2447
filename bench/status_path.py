"""The job status path's cost per job, in-process: ``python -m bench.status_path [--url URL] [--runs N]``.

- **store call**: one ``StatusBackend.apply`` of 1000 jobs' updates as the worker makes them
  (``running`` + ``succeeded`` in one batch, as under load; then 1000 senders' ``queued``): wall
  time of the call per job (on Redis: the script's run, the round trip and the client's encoding),
  and on Redis the server's CPU per job read from ``INFO cpu`` around the call (the server is
  shared: other clients' work shows up as noise).
- **hooks**: ``before_process_message`` + ``after_process_message`` of the Status middleware on
  5000 deliveries, with its DeferredWrites thread flushing to the store; process CPU
  (``time.process_time``, so the writer thread counts) per job, flush included.

Medians of ``--runs``; keys in a namespace of their own, deleted after. Measured when a batch's
updates were folded per record (issue 15; 2 cores, load ~2.5, medians of 5, µs per job, Redis,
base -> folded, two alternating rounds): pairs call 60.8/58.1 -> 27.8/31.5 (Redis CPU 51.5/49.7 ->
24.4/28.8), sent pairs 60.5/59.4 -> 27.6/36.8, queued 31.0/29.2 -> 20.6/22.8, hooks 24.5/25.1 ->
14.9/13.2 (see the commit messages for the steps).
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Callable

from dramatiq import Message
from dramatiq.broker import MessageProxy
from dramatiq.brokers.stub import StubBroker

from jobsystem.store import StateStore, open_store
from jobsystem.store.redis import RedisStore
from jobsystem.store.status import StatusBackend, status_backend
from jobsystem.store.status_records import StatusUpdate
from middleware.status import Status

JOBS = 1000
TTL_MS = 86_400_000


class _Collecting(Status):
    """The Status middleware with its updates kept in a list instead of written."""

    def __init__(self, store: StateStore) -> None:
        super().__init__(store)
        self.made: list[StatusUpdate] = []

    def _submit(self, update: StatusUpdate) -> None:
        self.made.append(update)


def _messages(count: int) -> list[Message[object]]:
    return [Message(queue_name="q", actor_name="job", args=(), kwargs={}, options={}) for _ in range(count)]


def _redis_cpu(store: StateStore) -> float:
    if not isinstance(store, RedisStore):
        return 0.0
    info = store.client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def job_updates(store: StateStore, jobs: int) -> tuple[list[StatusUpdate], list[StatusUpdate]]:
    """The updates the Status middleware makes for ``jobs`` jobs: the senders' (``queued``), and
    the worker's (``running`` and ``succeeded`` of each)."""
    messages, broker = _messages(jobs), StubBroker()
    senders, worker = _Collecting(store), _Collecting(store)
    for message in messages:
        senders.after_enqueue(broker, message, None)
    for message in messages:
        delivery = MessageProxy(message)
        worker.before_process_message(broker, delivery)
        worker.after_process_message(broker, delivery, result=None)
    return senders.made, worker.made


def store_call(store: StateStore, kind: str) -> tuple[float, float]:
    """µs per job of one apply of ``JOBS`` jobs' updates: wall time, and Redis's CPU (0 on SQLite).

    ``kind``: ``queued`` (senders), ``pairs`` (running+succeeded of jobs the store has no record
    of yet), ``sent pairs`` (the same after their ``queued`` was written: a move in the index).
    """
    backend = status_backend(store)
    queued, worked = job_updates(store, JOBS)
    if kind == "queued":
        return _timed_apply(store, backend, queued)
    if kind == "sent pairs":
        backend.apply(queued, TTL_MS)
    return _timed_apply(store, backend, worked)


def _timed_apply(
    store: StateStore, backend: StatusBackend, updates: list[StatusUpdate]
) -> tuple[float, float]:
    cpu, started = _redis_cpu(store), time.perf_counter()
    backend.apply(updates, TTL_MS)
    wall = time.perf_counter() - started
    return wall / JOBS * 1e6, (_redis_cpu(store) - cpu) / JOBS * 1e6


def hooks(store: StateStore, count: int = 5000) -> float:
    """Process CPU µs per job of the two hooks, the writer thread flushing to ``store``."""
    status, broker = Status(store), StubBroker()
    deliveries = [MessageProxy(m) for m in _messages(count)]
    started = time.process_time()
    for delivery in deliveries:
        status.before_process_message(broker, delivery)
        status.after_process_message(broker, delivery, result=None)
    status.flush(60)
    spent = time.process_time() - started
    status.writes.stop()
    return spent / count * 1e6


def _median(runs: int, measure: Callable[[], float]) -> float:
    return statistics.median(measure() for _ in range(runs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="redis://127.0.0.1:6379/15")
    parser.add_argument("--runs", type=int, default=5)
    options = parser.parse_args()
    store = open_store(options.url, namespace=f"bench-status-{uuid.uuid4().hex[:8]}:")
    try:
        for kind in ("pairs", "sent pairs", "queued"):
            calls = [store_call(store, kind) for _ in range(options.runs)]
            wall = statistics.median(c[0] for c in calls)
            cpu = statistics.median(c[1] for c in calls)
            print(f"{kind:10s} store call {wall:6.1f} us/job   redis cpu {cpu:6.1f} us/job")
        print(f"hooks      process cpu {_median(options.runs, lambda: hooks(store)):6.1f} us/job")
    finally:
        if isinstance(store, RedisStore):
            keys = list(store.client.scan_iter(f"{store.namespace}*", count=10_000))
            for i in range(0, len(keys), 1000):
                store.client.delete(*keys[i : i + 1000])
        store.close()


if __name__ == "__main__":
    main()
