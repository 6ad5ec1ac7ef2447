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

:func:`interleaved` probes several workers in one run, running side by side, each probe going to
the next worker in turn: a change in how fast the machine runs meanwhile (another guest on the
host, a frequency step) then reaches every worker's probes alike, where probing one worker after
the other lets it fall on one of them only. Each worker then waits for its next probe ``pause``
times the number of workers: idle, 200 ms for bare Dramatiq beside the full stack.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

import redis
from dramatiq import Message
from dramatiq.brokers.rabbitmq import RabbitmqBroker

from bench.costs import STORES
from bench.throughput import BIN, ROOT, Run, delete_queues

__all__ = [
    "FULL_STACK_ENV",
    "IDLE_PAUSE_S",
    "PACES",
    "Latency",
    "Target",
    "interleaved",
    "report",
    "send_to_start",
]

WARM_UP = 20
#: Long enough for everything the last job left behind to be done (see the module's docstring).
IDLE_PAUSE_S = 0.1
#: The paces at which the probes are sent: the pause after the last probe started, by name.
PACES = {"back to back": 0.0, f"idle ({IDLE_PAUSE_S * 1000:.0f} ms apart)": IDLE_PAUSE_S}
#: The settings of the full stack's latency workers: the project's defaults, lines in JSON.
FULL_STACK_ENV = {"STATE_URL": STORES["redis"], "LOG_LEVEL": "INFO", "LOG_FORMAT": "json"}


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


@dataclass
class Target:
    """A worker to probe: ``dramatiq MODULE`` with ``env`` added, sent to through ``broker``."""

    label: str
    module: str
    broker: RabbitmqBroker
    env: dict[str, str] = field(default_factory=dict)


class _Probed:
    """A running worker of a :class:`Target`, with the queue its probes go to and the Redis list
    its actor pushes each probe's delay to."""

    def __init__(
        self, target: Target, client: redis.Redis, processes: int, threads: int, env: dict[str, str]
    ) -> None:
        self.target, self.client = target, client
        self.queue, self.key = f"bench-{uuid.uuid4().hex[:8]}", f"bench:latency:{uuid.uuid4().hex[:8]}"
        self.run, self.sent = uuid.uuid4().hex[:8], 0
        self.delays: list[float] = []
        target.broker.declare_queue(self.queue, ensure=True)
        self.worker = subprocess.Popen(
            [str(BIN / "dramatiq"), target.module, "-p", str(processes), "-t", str(threads)],
            cwd=ROOT,
            env={
                **os.environ,
                "BENCH_QUEUE": self.queue,
                "BENCH_LATENCY_KEY": self.key,
                "LOG_LEVEL": "WARNING",
                **env,
                **target.env,
            },
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def probe(self, counted: bool) -> None:
        """Send one probe and wait for its actor to start; keep its delay if ``counted``."""
        args = (time.time(), f"{self.run}-{self.sent}")
        self.target.broker.enqueue(
            Message(queue_name=self.queue, actor_name="latency_probe", args=args, kwargs={}, options={})
        )
        answer = self.client.blpop([self.key], timeout=60 if self.sent == 0 else 10)
        if answer is None:
            raise RuntimeError(f"{self.target.label}: probe {self.sent} did not start")
        self.sent += 1
        if counted:
            self.delays.append(float(answer[1]))

    def close(self) -> None:
        self.worker.send_signal(signal.SIGTERM)
        self.worker.wait(60)
        self.client.delete(self.key)
        delete_queues(self.target.broker, self.queue)


@contextmanager
def _workers(
    targets: list[Target], processes: int, threads: int, env: dict[str, str]
) -> Iterator[list[_Probed]]:
    """A running worker of each target; each stopped, and its queue and list deleted, at the end."""
    client = redis.Redis.from_url("redis://127.0.0.1:6379/14")
    with ExitStack() as stack:
        stack.callback(client.close)
        probed = []
        for target in targets:
            probed.append(_Probed(target, client, processes, threads, env))
            stack.callback(probed[-1].close)
        yield probed


def interleaved(
    targets: list[Target], count: int, processes: int, threads: int, *, pause: float = 0.0, **env: str
) -> list[Latency]:
    """``count`` probes to a worker of each target, all running at once, the probes going to each
    in turn, always in the same order, each ``pause`` seconds after the last started: each worker
    then waits as long as any other for its next probe (``pause`` times the number of targets), and
    each probe arrives ``pause`` after the one before. (An order that changes from round to round
    gives some probes to the worker that took the last one: measured, those start sooner.)"""
    with _workers(targets, processes, threads, env) as probed:
        for round_ in range(WARM_UP + count):
            for worker in probed:
                worker.probe(counted=round_ >= WARM_UP)
                if pause:
                    time.sleep(pause)
        return [Latency(worker.target.label, worker.delays) for worker in probed]


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
    return interleaved([Target(label, module, broker)], count, processes, threads, pause=pause, **env)[0]


def report(bare: RabbitmqBroker, full: RabbitmqBroker, run: Run, repeat: int, count: int) -> Iterator[str]:
    """The lines of ``python -m bench``'s latency part: for each pace, bare Dramatiq's and the full
    stack's median and p99 (medians of ``repeat`` runs) and their ratio. Idle, the workers run side
    by side and take the probes in turn (:func:`interleaved`); back to back, one after the other
    (a worker's next probe would otherwise wait for the other's)."""
    yield "send -> start latency, one probe at a time, median of runs"
    targets = [
        Target("bare Dramatiq", "bench.bare", bare),
        Target("full stack (defaults + key + limit)", "bench.project", full),
    ]
    for pace, pause in PACES.items():
        # Fewer idle probes: each costs its pause (200 of the default 300 take 20 s a run).
        probes = count if not pause else max(count * 2 // 3, 1)
        how = (
            f"both workers running, probes to each in turn"
            f" (each worker's {len(targets) * pause * 1000:.0f} ms apart)"
            if pause
            else "one worker after the other"
        )
        yield f"  {pace}, {probes} probes, {how}"
        groups = [targets] if pause else [[target] for target in targets]
        runs = (
            found
            for _ in range(repeat)
            for group in groups
            for found in interleaved(group, probes, run.processes, run.threads, pause=pause, **FULL_STACK_ENV)
        )
        yield from _medians(runs)
    load = os.getloadavg()
    yield f"  load averages at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"


def _medians(runs: Iterable[Latency]) -> Iterator[str]:
    """Each label's median and p99 over its runs, then the second label's median over the first's."""
    figures: dict[str, list[Latency]] = {}
    for latency in runs:
        figures.setdefault(latency.label, []).append(latency)
    for label, each in figures.items():
        median = statistics.median(f.median_ms for f in each)
        p99 = statistics.median(f.p99_ms for f in each)
        yield f"    {label:<42} median {median:>6.2f} ms   p99 {p99:>6.2f} ms"
    bare, full = (statistics.median(f.median_ms for f in each) for each in figures.values())
    yield f"    {'ratio full / bare (median)':<44} {full / bare:>9.2f}"
