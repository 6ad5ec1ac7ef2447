"""Where an idle probe's send -> start time goes, step by step: bare Dramatiq and the full stack.

``python -m bench --only steps`` sends idle latency probes (as ``bench.latency`` does, each
:data:`~bench.latency.IDLE_PAUSE_S` after the last started) to a ``bench.step_worker`` of each
stack, which notes when each step of a probe's way through the worker began and ended; the bench
notes its own send hooks (the full stack's register the probe's idempotency key before the publish).
For each step it prints when the step ended and how long it took, in wall-clock time and in CPU time
of its thread, in ms from the send, medians over the probes, the two stacks side by side. A step
whose CPU time is close to its wall time was computing; one well short of it waited. A step that
began before the send (the consumer was already waiting for a delivery), or that is an instant (the
actor started), shows when it ended only.

Each figure is a median of its own: the difference between two steps' ends is not a duration (in
one probe, one hook follows another within a few µs; a step's own time is in brackets). The marks
cost a few µs each, so the traced probes are a little slower than ``bench.latency``'s: these figures
say where the time goes, that bench how much there is.
"""

from __future__ import annotations

import json
import statistics
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import redis
from dramatiq.brokers.rabbitmq import RabbitmqBroker

from bench.costs import STORES, bare_brokers, store_broker
from bench.latency import IDLE_PAUSE_S, WARM_UP, send_to_start
from bench.step_worker import Mark

__all__ = ["STARTED", "Steps", "probe_steps", "report", "steps_table"]

SENT = "send hooks (full stack: key registered)"
STARTED = "actor started"


@dataclass
class Steps:
    """A stack's steps: for each, when it ended and how long it took, wall and thread CPU time (ms),
    by probe."""

    label: str
    ended: dict[str, list[float]] = field(default_factory=dict)
    took: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, list[float]] = field(default_factory=dict)

    def add_probe(self, sent: float, marks: Iterable[Mark]) -> None:
        """One probe's marks (a step noted twice counts once: its first time). A step that began
        before the send (a wait) or took no time (an instant) counts its end only."""
        seen: set[str] = set()
        for step, began, ended, cpu in marks:
            if step in seen:
                continue
            seen.add(step)
            self.ended.setdefault(step, []).append((ended - sent) * 1000)
            if began >= sent and ended > began:
                self.took.setdefault(step, []).append((ended - began) * 1000)
                self.cpu.setdefault(step, []).append(cpu * 1000)

    def in_order(self) -> list[str]:
        """The steps, by the median of when they ended."""
        return sorted(self.ended, key=lambda step: statistics.median(self.ended[step]))

    def cell(self, step: str) -> str:
        """``ended (took/cpu)``, medians in ms; ``-`` for a step this stack does not have."""
        if step not in self.ended:
            return "-"
        ended = statistics.median(self.ended[step])
        if step not in self.took:
            return f"{ended:6.2f}" + " " * 12
        took, cpu = statistics.median(self.took[step]), statistics.median(self.cpu[step])
        return f"{ended:6.2f} ({took:4.2f}/{cpu:4.2f})"


def probe_steps(
    label: str, stack: str, broker: RabbitmqBroker, count: int, processes: int, threads: int, **env: str
) -> Steps:
    """``count`` idle probes through ``broker`` to a ``bench.step_worker`` of ``stack`` (``bare``
    or ``project``); the steps of those after the warm-up."""
    client = redis.Redis.from_url(STORES["redis"])
    steps_key = f"bench:steps:{uuid.uuid4().hex[:8]}"
    sends: dict[str, Mark] = {}
    emit_before = broker.emit_before

    def noted(signal: str, *args: Any, **kwargs: Any) -> None:
        began, cpu = time.time(), time.thread_time()
        emit_before(signal, *args, **kwargs)
        if signal == "enqueue":
            sends[args[0].args[1]] = (SENT, began, time.time(), time.thread_time() - cpu)

    broker.emit_before = noted  # type: ignore[method-assign]
    try:
        send_to_start(
            label,
            "bench.step_worker",
            broker,
            count,
            processes,
            threads,
            pause=IDLE_PAUSE_S,
            BENCH_STACK=stack,
            BENCH_STEPS_KEY=steps_key,
            **env,
        )
        records = [json.loads(raw) for raw in client.lrange(steps_key, 0, -1)]
    finally:
        del broker.emit_before
        client.delete(steps_key)
        client.close()
    steps = Steps(label)
    for record in records[WARM_UP:]:
        started = (STARTED, record["started"], record["started"], 0.0)
        steps.add_probe(record["sent"], [sends[record["key"]], *map(tuple, record["marks"]), started])
    return steps


def steps_table(bare: Steps, full: Steps) -> list[str]:
    """The steps of both stacks in the order they ended on the full stack, a step of bare Dramatiq's
    only after the step it follows on bare Dramatiq; ``actor started`` last."""
    order = [step for step in full.in_order() if step != STARTED]
    bare_order = bare.in_order()
    for place, step in enumerate(bare_order):
        if step not in order and step != STARTED:
            shared = [order.index(earlier) for earlier in bare_order[:place] if earlier in order]
            order.insert(max(shared, default=-1) + 1, step)
    out = [f"  {'step':<52} {bare.label:>19} {full.label:>19}"]
    out += [f"  {step:<52} {bare.cell(step):>19} {full.cell(step):>19}" for step in [*order, STARTED]]
    return out


def report(count: int, processes: int, threads: int) -> list[str]:
    """``count`` idle probes to bare Dramatiq's worker, then to the full stack's (lifecycle lines at
    INFO in JSON, Redis state, as ``bench.latency``), and the table of their steps."""
    from jobsystem.system import get_system

    env = {"STATE_URL": STORES["redis"], "LOG_LEVEL": "INFO", "LOG_FORMAT": "json"}
    full = store_broker(STORES["redis"])
    brokers = bare_brokers(get_system().settings.rabbitmq_url)
    try:
        bare = probe_steps("bare", "bare", brokers[False], count, processes, threads, **env)
        project = probe_steps("full stack", "project", full, count, processes, threads, **env)
    finally:
        for broker in brokers.values():
            broker.close()
    head = (
        f"where an idle probe's send -> start time goes, {count} probes {IDLE_PAUSE_S * 1000:.0f} ms apart:"
        " ms from the send when each step ended (how long it took: wall/thread CPU), medians"
    )
    return [head, *steps_table(bare, project)]
