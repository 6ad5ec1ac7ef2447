"""Send -> start latency on an idle worker: bare Dramatiq against the project's full stack.

One message at a time: the bench notes the time, sends a ``latency_probe`` (the project's is keyed
and takes a token of a bucket that never runs dry), and waits (BLPOP) for the delay the actor
noted when it started, before sending the next. The first few probes warm the worker up and are
not counted.

Two paces (:data:`PACES`). Back to back, the next probe is sent the moment the last one started:
it then meets the project's worker still finishing the last job (its completion and status
writes, its lines, its ack held for a cumulative one), which bare Dramatiq's worker barely has.
Idle, each probe waits :data:`IDLE_PAUSE_S` after the last started, longer than anything a job
leaves behind (the log batch's 50 ms, the ack hold's 10 ms): both workers are then asleep, with
their caches cold, when the probe arrives.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import time
import uuid

import redis
from dramatiq import Message
from dramatiq.brokers.rabbitmq import RabbitmqBroker

from bench.throughput import BIN, ROOT, delete_queues

__all__ = ["IDLE_PAUSE_S", "PACES", "Latency", "send_to_start"]

WARM_UP = 20
#: Long enough for everything the last job left behind to be done (see the module's docstring).
IDLE_PAUSE_S = 0.1
#: The paces at which the probes are sent: the pause after the last probe started, by name.
PACES = {"back to back": 0.0, f"idle ({IDLE_PAUSE_S * 1000:.0f} ms apart)": IDLE_PAUSE_S}


class Latency:
    """Send -> start delays in seconds, sorted."""

    def __init__(self, label: str, delays: list[float]) -> None:
        self.label, self.delays = label, sorted(delays)

    @property
    def median_ms(self) -> float:
        return statistics.median(self.delays) * 1000

    @property
    def p99_ms(self) -> float:
        return self.delays[min(len(self.delays) - 1, int(len(self.delays) * 0.99))] * 1000


def send_to_start(
    label: str,
    module: str,
    broker: RabbitmqBroker,
    count: int,
    processes: int,
    threads: int,
    *,
    pause: float = 0.0,
    **env: str,
) -> Latency:
    """``count`` sequential probes through ``broker`` to a ``dramatiq MODULE`` worker, the next sent
    as soon as the last started, or ``pause`` seconds after."""
    client = redis.Redis.from_url("redis://127.0.0.1:6379/14")
    queue, key = f"bench-{uuid.uuid4().hex[:8]}", f"bench:latency:{uuid.uuid4().hex[:8]}"
    broker.declare_queue(queue, ensure=True)
    worker = subprocess.Popen(
        [str(BIN / "dramatiq"), module, "-p", str(processes), "-t", str(threads)],
        cwd=ROOT,
        env={**os.environ, "BENCH_QUEUE": queue, "BENCH_LATENCY_KEY": key, "LOG_LEVEL": "WARNING", **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    delays: list[float] = []
    run = uuid.uuid4().hex[:8]
    try:
        for i in range(WARM_UP + count):
            args = (time.time(), f"{run}-{i}")
            broker.enqueue(
                Message(queue_name=queue, actor_name="latency_probe", args=args, kwargs={}, options={})
            )
            answer = client.blpop([key], timeout=60 if i == 0 else 10)
            if answer is None:
                raise RuntimeError(f"{label}: probe {i} did not start")
            if i >= WARM_UP:
                delays.append(float(answer[1]))
            if pause:
                time.sleep(pause)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
        client.delete(key)
        delete_queues(broker, queue)
    return Latency(label, delays)
