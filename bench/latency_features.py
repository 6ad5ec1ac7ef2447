"""What each default feature costs an idle job's send -> start time: the full stack beside itself
with that feature off.

``python -m bench --only latency-features`` runs, for each variant, three workers side by side
(:func:`bench.latency.interleaved`): bare Dramatiq, the full stack, and the full stack with one
setting changed (its sender too), the idle probes going to each in turn. Each run prints the three
medians and the variant's difference from the full stack in that run; the end, each variant's
median difference over the repetitions. The control runs the full stack again in the variant's
place: what the third place alone does, and how far one run's difference moves (+-0.1 ms here).

The cost table prices each feature in worker CPU under load; this prices it on the latency goal.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator

from dramatiq.brokers.rabbitmq import RabbitmqBroker

from bench.latency import FULL_STACK_ENV, IDLE_PAUSE_S, Target, interleaved
from bench.ports import free_port
from bench.throughput import Run

__all__ = ["VARIANTS", "report"]

#: The full stack with one feature off, by name; the control changes nothing.
VARIANTS: dict[str, dict[str, str]] = {
    "control (the full stack again)": {},
    "no lifecycle lines (LOG_LEVEL=WARNING)": {"LOG_LEVEL": "WARNING"},
    "no job status (JOB_STATUS=false)": {"JOB_STATUS": "false"},
    "no metrics (PROMETHEUS_PORT=0)": {"PROMETHEUS_PORT": "0"},
}

#: Makes the project's sending broker with the given settings changed.
MakeSender = Callable[..., RabbitmqBroker]


def report(bare: RabbitmqBroker, make_sender: MakeSender, run: Run, repeat: int, count: int) -> Iterator[str]:
    """The lines of ``--only latency-features``: ``repeat`` runs of each variant, ``count`` idle
    probes to each of the three workers per run, then the median difference of each variant."""
    yield (
        f"send -> start latency with one feature off, {count} idle probes to each of three workers"
        f" in turn (each worker's {3 * IDLE_PAUSE_S * 1000:.0f} ms apart), ms"
    )
    full = make_sender()
    differences: dict[str, list[float]] = {}
    try:
        for i in range(repeat):
            for name, env in VARIANTS.items():
                sender = make_sender(**env)
                targets = [
                    Target("bare Dramatiq", "bench.bare", bare),
                    Target("full stack", "bench.project", full, {"PROMETHEUS_PORT": str(free_port())}),
                    Target(name, "bench.project", sender, {"PROMETHEUS_PORT": str(free_port()), **env}),
                ]
                try:
                    found = interleaved(
                        targets, count, run.processes, run.threads, pause=IDLE_PAUSE_S, **FULL_STACK_ENV
                    )
                finally:
                    sender.close()
                b, f, v = (latency.median_ms for latency in found)
                differences.setdefault(name, []).append(v - f)
                yield (
                    f"  [{i + 1}/{repeat}] {name:<40} bare {b:5.2f}  full {f:5.2f} ({f / b:.2f}x)"
                    f"  variant {v:5.2f}  difference {v - f:+.3f}"
                )
    finally:
        full.close()
    yield "  median difference from the full stack"
    for name, each in differences.items():
        yield f"    {name:<44} {statistics.median(each):+7.3f} ms"
