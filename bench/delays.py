"""Delays: how fast delayed messages are sent, and how close to their due time they run.

``python -m bench --only delays``: N messages (10,000 by default) with delays drawn uniformly from
1 to 120 s are sent one ``enqueue(delay=...)`` at a time (a confirm each) through the project's
broker; those past the horizon (``DELAY_HORIZON_MS``, 30 s) go into RabbitMQ's delay cascade,
the others to the delay queue, held by the worker. A worker (the project's stack, the bench's
no-op actor noting its start, the 100 ms tick ``jobctl worker`` sets) runs them all; each start
is compared with the message's ``eta``.
Everything runs under a ``QUEUE_PREFIX`` of its own, deleted afterwards (cascade and state keys
included, see :mod:`bench.scratch`).
"""

from __future__ import annotations

import os
import random
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import redis
from dramatiq import Message

from bench import scratch

__all__ = ["delay_figures"]

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
REDIS_URL = "redis://127.0.0.1:6379/14"


def _send(
    broker: Any, queue: str, count: int, horizon_ms: int
) -> tuple[dict[str, tuple[int, int]], float, dict[bool, list[float]]]:
    """Send ``count`` delayed no-ops: their ``(eta, delay)`` by message id, the seconds taken, and
    the seconds each send took, apart for the cascade (True) and the delay queue (False)."""
    sent: dict[str, tuple[int, int]] = {}
    took: dict[bool, list[float]] = {True: [], False: []}
    started = time.perf_counter()
    for _ in range(count):
        delay = random.randint(1_000, 120_000)
        message: Message[Any] = Message(
            queue_name=queue, actor_name="timed_noop", args=(), kwargs={}, options={}
        )
        before = time.perf_counter()
        enqueued = broker.enqueue(message, delay=delay)
        took[delay > horizon_ms].append(time.perf_counter() - before)
        sent[enqueued.message_id] = (int(enqueued.options["eta"]), delay)
    return sent, time.perf_counter() - started, took


def _percentiles(errors: list[float]) -> str:
    if not errors:
        return "none"
    ordered = sorted(errors)

    def at(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000

    return (
        f"median {statistics.median(ordered) * 1000:7.0f}  p95 {at(0.95):7.0f}  p99 {at(0.99):7.0f}  "
        f"max {ordered[-1] * 1000:7.0f}  min {ordered[0] * 1000:6.0f} ms  (n={len(ordered):,})"
    )


def _cleanup(broker: Any, settings: Any) -> None:
    scratch.delete_topology(broker, settings)
    scratch.delete_state(REDIS_URL, settings.queue_prefix)


def delay_figures(count: int = 10_000, processes: int = 1, threads: int = 8) -> list[str]:
    """Send ``count`` randomly delayed messages, run them, and report the send rate and the errors."""
    from bench.costs import store_broker
    from jobsystem.settings import load_settings

    prefix = scratch.new_prefix()
    queue, starts_key = f"{prefix}delays", f"bench:starts:{uuid.uuid4().hex[:8]}"
    env = {"QUEUE_PREFIX": prefix, "BENCH_QUEUE": queue, "BENCH_STARTS_KEY": starts_key}
    broker = store_broker(REDIS_URL, **env)
    broker.declare_queue(queue, ensure=True)
    client = redis.Redis.from_url(REDIS_URL)
    worker = subprocess.Popen(
        [str(BIN / "dramatiq"), "bench.project", "-p", str(processes), "-t", str(threads)],
        cwd=ROOT,
        # The consumer threads' tick jobctl worker sets (jobctl.main.WORKER_TICK_MS), unless given.
        env={
            "dramatiq_worker_timeout": "100",
            **os.environ,
            **env,
            "STATE_URL": REDIS_URL,
            "LOG_LEVEL": "WARNING",
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        horizon = broker.delay_horizon_ms
        sent, seconds, took = _send(broker, queue, count, horizon)
        deadline = time.monotonic() + 180
        while client.llen(starts_key) < count and time.monotonic() < deadline:
            time.sleep(0.5)
        lines: list[bytes] = client.lrange(starts_key, 0, -1)  # type: ignore[assignment]
        starts = {message_id: at for message_id, at in (line.decode().split() for line in lines)}
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
        client.delete(starts_key)
        _cleanup(broker, load_settings({**os.environ, **env}))
    errors = {mid: float(at) - sent[mid][0] / 1000 for mid, at in starts.items() if mid in sent}
    held = [e for mid, e in errors.items() if sent[mid][1] <= horizon]
    cascade = [e for mid, e in errors.items() if sent[mid][1] > horizon]
    return [
        f"  {'delayed sends, enqueue() loop, confirm each':<44} {count / seconds:>9,.0f} /s   "
        f"({count:,} in {seconds:.1f} s, delays 1-120 s)",
        f"  {'  of which into the cascade / the delay queue':<44} "
        f"{len(took[True]) / sum(took[True]):>9,.0f} /s / {len(took[False]) / sum(took[False]):,.0f} /s",
        f"  {'ran / sent (early: before eta)':<44} {len(errors):>9,} / {count:,}   "
        f"(early {sum(e < 0 for e in errors.values())})",
        f"  start - eta, all        {_percentiles(list(errors.values()))}",
        f"  start - eta, cascade    {_percentiles(cascade)}",
        f"  start - eta, held <= {horizon // 1000} s {_percentiles(held)}",
    ]
