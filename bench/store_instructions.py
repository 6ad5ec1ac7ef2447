"""What the store's scripts cost Redis per job, in instructions: ``python -m bench.store_instructions``.

Counted on a Redis of its own under callgrind (:mod:`bench.callgrind`): within about 1.5% from run
to run, unlike CPU time on this machine, so a change to a script shows its price.

- **status**: the sender's ``queued`` of each job, then the worker's ``running`` + ``succeeded``
  (a move in the job index), in batches as the deferred writer sends them (20 jobs a batch is
  typical of a loaded worker; 1000 the bound of what batching can save).
- **idempotency**: the registration at send (one bulk send), the claim at run (batches of 1, 4
  and 32 claims: idle, and two loads), the completion (batches of 50).

Each figure is instructions per job (or key) over ``--jobs`` jobs, in thousands.
"""

from __future__ import annotations

import argparse
import uuid
from collections.abc import Callable
from functools import partial

from bench.callgrind import CallgrindRedis, callgrind_redis
from bench.status_path import TTL_MS, job_updates
from jobsystem.store import StateStore, open_store
from jobsystem.store.idempotency import ClaimRequest, idempotency_backend
from jobsystem.store.status import status_backend
from jobsystem.store.status_records import StatusUpdate

__all__ = ["idempotency_costs", "status_costs"]

#: Seconds a call may take: the server runs ~50x slower under valgrind.
TIMEOUT_S = 120.0


def _per_job(server: CallgrindRedis, jobs: int, call: Callable[[], object]) -> float:
    return server.instructions(call) / jobs / 1000


def _in_batches(store: StateStore, updates: list[StatusUpdate], size: int) -> Callable[[], None]:
    backend = status_backend(store)

    def apply() -> None:
        for i in range(0, len(updates), size):
            backend.apply(updates[i : i + size], TTL_MS)

    return apply


def status_costs(server: CallgrindRedis, store: StateStore, jobs: int, batch: int) -> dict[str, float]:
    """Thousands of instructions per job: ``queued``, then ``running`` + ``succeeded``."""
    for updates in job_updates(store, 1):  # the script loaded before anything is counted
        _in_batches(store, updates, batch)()
    queued, worked = job_updates(store, jobs)
    return {
        "queued": _per_job(server, jobs, _in_batches(store, queued, batch)),
        "running + succeeded": _per_job(server, jobs, _in_batches(store, worked, 2 * batch)),
    }


def _claims(store: StateStore, keys: list[str], size: int) -> Callable[[], None]:
    backend = idempotency_backend(store)
    claims = [ClaimRequest(key, "m", uuid.uuid4().hex[:12], 30_000, TTL_MS) for key in keys]

    def claim() -> None:
        for i in range(0, len(claims), size):
            backend.claim_many(claims[i : i + size])

    return claim


def _completions(store: StateStore, keys: list[str]) -> Callable[[], None]:
    backend = idempotency_backend(store)
    done: list[tuple[str, str | None, int]] = [(key, "null", TTL_MS) for key in keys]

    def complete() -> None:
        for i in range(0, len(done), 50):
            backend.complete_many(done[i : i + 50])

    return complete


def idempotency_costs(server: CallgrindRedis, store: StateStore, jobs: int) -> dict[str, float]:
    """Thousands of instructions per key: registration, claims in batches of 1, 4, 32, completion."""
    backend = idempotency_backend(store)
    warm = [f"warm:{uuid.uuid4().hex}"]  # the scripts loaded before anything is counted
    backend.register_many([(warm[0], "m", TTL_MS)])
    _claims(store, warm, 1)()
    _completions(store, warm)()
    claims: dict[str, float] = {}
    register = 0.0
    for size in (1, 4, 32):  # fresh keys for each size, registered first
        keys = [f"noop:{uuid.uuid4().hex}" for _ in range(jobs)]
        # counted the last time: into a keyspace that already holds keys, as in production
        register = _per_job(
            server, jobs, partial(backend.register_many, [(k, str(uuid.uuid4()), TTL_MS) for k in keys])
        )
        claims[f"claim, batches of {size}"] = _per_job(server, jobs, _claims(store, keys, size))
    complete = _per_job(server, jobs, _completions(store, keys))
    return {"register (one bulk send)": register, **claims, "complete, batches of 50": complete}


def report(jobs: int = 1000) -> list[str]:
    """The figures as ``make bench`` prints them (a Redis under callgrind started and stopped)."""
    lines = [f"thousands of Redis instructions per job (callgrind), {jobs:,} jobs a figure"]
    with callgrind_redis() as server:
        store = open_store(server.url, namespace="bench-instructions:", timeout=TIMEOUT_S)
        try:
            for batch in (20, 1000):
                for name, cost in status_costs(server, store, jobs, batch).items():
                    lines.append(f"  {f'status, {name}, batches of {batch}':<52} {cost:>7.1f}")
            for name, cost in idempotency_costs(server, store, jobs).items():
                lines.append(f"  {f'idempotency, {name}':<52} {cost:>7.1f}")
        finally:
            store.close()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000, help="jobs (keys) per figure")
    for line in report(parser.parse_args().jobs):
        print(line)


if __name__ == "__main__":
    main()
