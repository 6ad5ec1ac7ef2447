"""The cost table: bare Dramatiq, then the project's worker with each feature added one at a time.

Every row runs the same queue shape and processes x threads as bare Dramatiq, in the same
invocation, on the Redis state store; it reports jobs/s, the ratio to bare of the same repetition,
the worker group's CPU per job and the CPU per job of the RabbitMQ and Redis servers, which share
the cores (see ``bench.throughput``). ``--repeat N`` prints the median of N repetitions of each
figure (ratios are taken within a repetition, then their median).

What the table showed at each step of issue 15, before and after, with the load of the machine:
``docs/benchmarks.md``.
"""

from __future__ import annotations

import os
import socket
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from dramatiq import Message
from dramatiq.brokers.rabbitmq import RabbitmqBroker

from bench.throughput import ROOT, Rate, Run, keyed_messages, noop_messages

__all__ = ["STORES", "CostTable", "cost_table", "store_broker"]

#: The two state stores the figures are taken on.
STORES = {"redis": "redis://127.0.0.1:6379/14", "sqlite": f"sqlite:///{ROOT}/var/bench-state.db"}

MakeMessages = Callable[[str, int], list[Message[Any]]]

#: Everything the project can turn off: no lifecycle logs, no job status, no Prometheus.
OFF = {"LOG_LEVEL": "WARNING", "JOB_STATUS": "false", "PROMETHEUS_PORT": "0"}
LOGS = {"LOG_LEVEL": "INFO", "LOG_FORMAT": "json"}


def _free_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


def _rows() -> list[tuple[str, MakeMessages, dict[str, str]]]:
    """(label, messages, worker env) of each row after bare Dramatiq."""
    defaults = {**LOGS, "JOB_STATUS": "true", "PROMETHEUS_PORT": _free_port()}
    keyed_metered = partial(keyed_messages, actor="keyed_metered_noop")
    return [
        ("project, everything off", noop_messages, OFF),
        ("+ lifecycle logs (INFO, JSON)", noop_messages, {**OFF, **LOGS}),
        ("+ job status", noop_messages, {**OFF, **LOGS, "JOB_STATUS": "true"}),
        ("+ Prometheus (= defaults)", noop_messages, defaults),
        ("defaults + idempotency key", keyed_messages, defaults),
        ("defaults + key + rate-limited bucket", keyed_metered, defaults),
        ("everything off + key + rate-limited bucket", keyed_metered, OFF),
    ]


#: The issue's table: (label, row of the cost table).
ISSUE_ROWS = (
    ("defaults + key + rate limit", "defaults + key + rate-limited bucket"),
    ("defaults, no key, no rate limit", "+ Prometheus (= defaults)"),
    ("all off + key + rate limit", "everything off + key + rate-limited bucket"),
    ("all off, no key, no rate limit", "project, everything off"),
)
BARE = "bare Dramatiq, default middleware"
#: The row a row's "+ us" is counted from, where it is not the row above.
ADDS_TO = {"everything off + key + rate-limited bucket": "project, everything off"}


@dataclass
class CostTable:
    """Figures of every repetition, by row label, in row order."""

    rates: dict[str, list[Rate]] = field(default_factory=dict)
    ratios: dict[str, list[float]] = field(default_factory=dict)

    def add(self, rate: Rate, bare: Rate) -> None:
        self.rates.setdefault(rate.label, []).append(rate)
        self.ratios.setdefault(rate.label, []).append(rate.per_second / bare.per_second)

    def median_ratio(self, label: str) -> float:
        return statistics.median(self.ratios[label])

    def lines(self) -> list[str]:
        out = [
            f"  {'configuration':<44} {'jobs/s':>8} {'/ bare':>7} {'CPU us/job':>11} {'+ us':>7}"
            f" {'RabbitMQ us':>12} {'Redis us':>9}"
        ]
        cpus: dict[str, float] = {}
        previous: str | None = None
        for label, rates in self.rates.items():
            cpus[label] = cpu = statistics.median(r.cpu_micros_per_job for r in rates)
            jobs = statistics.median(r.per_second for r in rates)
            base = ADDS_TO.get(label, previous)
            step = "" if base is None else f"{cpu - cpus[base]:>+7.0f}"
            rabbitmq = statistics.median(r.rabbitmq_micros_per_job for r in rates)
            redis = statistics.median(r.redis_micros_per_job for r in rates)
            out.append(
                f"  {label:<44} {jobs:>8,.0f} {self.median_ratio(label):>7.2f} {cpu:>11.0f} {step:>7}"
                f" {rabbitmq:>12.0f} {redis:>9.0f}"
            )
            previous = label
        out.append(f"  {'issue 15 table (jobs/s / bare, medians)':<44}")
        out += [f"    {name:<42} {self.median_ratio(row):>9.2f}" for name, row in ISSUE_ROWS]
        return out


def store_broker(state_url: str, **env: str) -> RabbitmqBroker:
    """The project's broker and middleware on ``state_url`` (other settings from ``env``), knowing
    the bench's actors."""
    import bench.project  # declares the bench's actors on the process's system
    from jobsystem.settings import load_settings
    from jobsystem.system import build_system, get_system

    broker = build_system(load_settings({**os.environ, "STATE_URL": state_url, **env})).broker
    broker.actors.update(get_system().broker.actors)
    assert "keyed_noop" in broker.actors and bench.project.QUEUE
    return broker


def cost_table(run: Run, bare_broker: RabbitmqBroker, repeat: int) -> CostTable:
    """``repeat`` repetitions of bare Dramatiq then every row, each printed as it completes."""
    url = STORES["redis"]
    senders = {flag: store_broker(url, JOB_STATUS=flag) for flag in ("true", "false")}
    table = CostTable()
    for i in range(repeat):
        bare = run.throughput(BARE, "bench.bare", bare_broker)
        table.add(bare, bare)
        print(f"  [{i + 1}/{repeat}] {bare.label:<42} {bare.per_second:>8,.0f} /s", flush=True)
        for label, make, env in _rows():
            sender = senders[env["JOB_STATUS"]]
            rate = run.throughput(label, "bench.project", sender, make, STATE_URL=url, **env)
            table.add(rate, bare)
            print(
                f"  [{i + 1}/{repeat}] {label:<42} {rate.per_second:>8,.0f} /s"
                f" {rate.per_second / bare.per_second:>6.2f} {rate.cpu_micros_per_job:>7.0f} us"
                f" (RabbitMQ {rate.rabbitmq_micros_per_job:.0f}, Redis {rate.redis_micros_per_job:.0f})",
                flush=True,
            )
    return table
