"""The cost table: bare Dramatiq, then the project's worker with each feature added one at a time.

Every row runs the same processes x threads as bare Dramatiq, in the same invocation, on the
Redis state store; it reports jobs/s, the worker group's CPU per job and the CPU per job of the
RabbitMQ and Redis servers, which share the cores (see ``bench.throughput``), the shares of the
machine's CPU time left idle and stolen by the hypervisor over the window, and two ratios of
jobs/s within the same repetition: ``/ bare``, to bare Dramatiq as it comes (plain queues), and
``/ same shape``, to bare Dramatiq on queues of the row's shape. The project's queues take
priorities by default (``x-max-priority``, which costs RabbitMQ CPU per message), so bare Dramatiq
runs twice, on plain and on priority queues, and the defaults and the full stack run again on
plain queues (``RABBITMQ_MAX_PRIORITY=0``). The last row gives the full stack a prefetch of 64
(``WORKER_PREFETCH``, 4x Dramatiq's twice the threads) and is compared with bare Dramatiq given
the same through Dramatiq's ``dramatiq_queue_prefetch``: the tuning for many short jobs, priced
for both. ``--repeat N`` prints the median of N repetitions of each figure (ratios are taken
within a repetition, then their median).

What the table showed at each step of issue 15, before and after, with the load of the machine:
``docs/benchmarks.md``.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from dramatiq import Message
from dramatiq.brokers.rabbitmq import RabbitmqBroker

from bench.ports import free_port
from bench.throughput import ROOT, Rate, Run, keyed_messages, noop_messages
from jobsystem.settings import Settings

if TYPE_CHECKING:
    from jobsystem.rabbitmq.broker import ProjectBroker

__all__ = [
    "BARE",
    "STORES",
    "CostTable",
    "Row",
    "bare_brokers",
    "cost_table",
    "rows",
    "run_row",
    "store_broker",
]

#: The two state stores the figures are taken on.
STORES = {"redis": "redis://127.0.0.1:6379/14", "sqlite": f"sqlite:///{ROOT}/var/bench-state.db"}

MakeMessages = Callable[[str, int], list[Message[Any]]]

#: Everything the project can turn off: no lifecycle logs, no job status, no Prometheus.
OFF = {"LOG_LEVEL": "WARNING", "JOB_STATUS": "false", "PROMETHEUS_PORT": "0"}
LOGS = {"LOG_LEVEL": "INFO", "LOG_FORMAT": "json"}


#: ``x-max-priority`` of the project's queues by default (``RABBITMQ_MAX_PRIORITY``).
PRIORITY_LEVELS: int = Settings.model_fields["rabbitmq_max_priority"].default


@dataclass(frozen=True)
class Row:
    """One configuration: its worker module, messages and environment, and its queues' shape
    (``priority``: declared with ``x-max-priority``, as the project's are by default); ``same``:
    the bare row it is compared with in ``/ same shape``, when not the one of its queues' shape."""

    label: str
    module: str
    make: MakeMessages
    env: dict[str, str]
    priority: bool = True
    same: str | None = None


BARE = "bare Dramatiq, default middleware"
BARE_PRIORITY = f"bare Dramatiq, x-max-priority {PRIORITY_LEVELS} queues"
#: A deeper prefetch than Dramatiq's twice the threads: the tuning ``WORKER_PREFETCH`` offers for
#: many short jobs, given to bare Dramatiq (through its own variable) and to the full stack alike.
DEEP_PREFETCH = "64"
BARE_DEEP = f"bare Dramatiq, priority queues, prefetch {DEEP_PREFETCH}"
FULL_DEEP = f"full stack, WORKER_PREFETCH {DEEP_PREFETCH}"
FULL_PLAIN = "full stack, plain queues (max priority 0)"
DEFAULTS_PLAIN = "defaults, plain queues (max priority 0)"


def rows() -> list[Row]:
    """Every row of the table, bare Dramatiq first."""
    on_priority = {"RABBITMQ_MAX_PRIORITY": str(PRIORITY_LEVELS)}
    off = {**OFF, **on_priority}
    logs = {**off, **LOGS}
    defaults = {**logs, "JOB_STATUS": "true", "PROMETHEUS_PORT": str(free_port())}
    plain_defaults = {**defaults, "RABBITMQ_MAX_PRIORITY": "0"}
    keyed_metered = partial(keyed_messages, actor="keyed_metered_noop")
    project = "bench.project"
    return [
        Row(BARE, "bench.bare", noop_messages, {}, priority=False),
        Row(BARE_PRIORITY, "bench.bare", noop_messages, {"BENCH_MAX_PRIORITY": str(PRIORITY_LEVELS)}),
        Row(
            BARE_DEEP,
            "bench.bare",
            noop_messages,
            {"BENCH_MAX_PRIORITY": str(PRIORITY_LEVELS), "dramatiq_queue_prefetch": DEEP_PREFETCH},
        ),
        Row("project, everything off", project, noop_messages, off),
        Row("+ lifecycle logs (INFO, JSON)", project, noop_messages, logs),
        Row("+ job status", project, noop_messages, {**logs, "JOB_STATUS": "true"}),
        Row("+ Prometheus (= defaults)", project, noop_messages, defaults),
        Row("defaults + idempotency key", project, keyed_messages, defaults),
        Row("defaults + key + rate-limited bucket", project, keyed_metered, defaults),
        Row("everything off + key + rate-limited bucket", project, keyed_metered, off),
        Row(FULL_PLAIN, project, keyed_metered, plain_defaults, priority=False),
        Row(DEFAULTS_PLAIN, project, noop_messages, plain_defaults, priority=False),
        Row(
            FULL_DEEP, project, keyed_metered, {**defaults, "WORKER_PREFETCH": DEEP_PREFETCH}, same=BARE_DEEP
        ),
    ]


#: The issue's table: (label, row of the cost table).
ISSUE_ROWS = (
    ("defaults + key + rate limit", "defaults + key + rate-limited bucket"),
    ("defaults, no key, no rate limit", "+ Prometheus (= defaults)"),
    ("all off + key + rate limit", "everything off + key + rate-limited bucket"),
    ("all off, no key, no rate limit", "project, everything off"),
    ("defaults + key + rate limit, plain queues", FULL_PLAIN),
    ("defaults, no key, no limit, plain queues", DEFAULTS_PLAIN),
    (f"full stack, prefetch {DEEP_PREFETCH}, vs bare at {DEEP_PREFETCH}", FULL_DEEP),
)
#: The row a row's "+ us" is counted from, where it is not the row above.
ADDS_TO = {
    "project, everything off": BARE_PRIORITY,
    "everything off + key + rate-limited bucket": "project, everything off",
    FULL_PLAIN: "defaults + key + rate-limited bucket",
    DEFAULTS_PLAIN: "+ Prometheus (= defaults)",
    BARE_DEEP: BARE_PRIORITY,
    FULL_DEEP: "defaults + key + rate-limited bucket",
}


@dataclass
class CostTable:
    """Figures of every repetition, by row label, in row order: each row's jobs/s over bare
    Dramatiq's (plain queues, as Dramatiq declares them) and over bare Dramatiq's on queues of
    the same shape (``same``), both of the same repetition."""

    rates: dict[str, list[Rate]] = field(default_factory=dict)
    ratios: dict[str, list[float]] = field(default_factory=dict)
    same: dict[str, list[float]] = field(default_factory=dict)

    def add(self, rate: Rate, bare: Rate, same_shape: Rate) -> None:
        self.rates.setdefault(rate.label, []).append(rate)
        self.ratios.setdefault(rate.label, []).append(rate.per_second / bare.per_second)
        self.same.setdefault(rate.label, []).append(rate.per_second / same_shape.per_second)

    def median_ratio(self, label: str, same_shape: bool = False) -> float:
        return statistics.median((self.same if same_shape else self.ratios)[label])

    def lines(self) -> list[str]:
        out = [
            f"  {'configuration':<44} {'jobs/s':>8} {'/ bare':>7} {'/ same shape':>12} {'CPU us/job':>11}"
            f" {'+ us':>7} {'RabbitMQ us':>12} {'Redis us':>9} {'idle':>5} {'steal':>5}"
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
            idle = statistics.median(r.idle_share for r in rates)
            steal = statistics.median(r.steal_share for r in rates)
            out.append(
                f"  {label:<44} {jobs:>8,.0f} {self.median_ratio(label):>7.2f}"
                f" {self.median_ratio(label, same_shape=True):>12.2f} {cpu:>11.0f} {step:>7}"
                f" {rabbitmq:>12.0f} {redis:>9.0f} {idle:>5.0%} {steal:>5.0%}"
            )
            previous = label
        out.append(f"  {'issue 15 table (jobs/s / bare, medians)':<44} {'/ bare':>16} {'/ same shape':>12}")
        out += [
            f"    {name:<42} {self.median_ratio(row):>16.2f} {self.median_ratio(row, same_shape=True):>12.2f}"
            for name, row in ISSUE_ROWS
        ]
        return out


def store_broker(state_url: str, **env: str) -> ProjectBroker:
    """The project's broker and middleware on ``state_url`` (other settings from ``env``), knowing
    the bench's actors."""
    import bench.project  # declares the bench's actors on the process's system
    from jobsystem.settings import load_settings
    from jobsystem.system import build_system, get_system

    broker = build_system(load_settings({**os.environ, "STATE_URL": state_url, **env})).broker
    broker.actors.update(get_system().broker.actors)
    assert "keyed_noop" in broker.actors and bench.project.QUEUE
    return broker


def bare_brokers(rabbitmq_url: str) -> dict[bool, RabbitmqBroker]:
    """Bare Dramatiq's brokers, by whether their queues take priorities (the project's shape)."""
    return {
        False: RabbitmqBroker(url=rabbitmq_url),
        True: RabbitmqBroker(url=rabbitmq_url, max_priority=PRIORITY_LEVELS),
    }


def run_row(
    run: Run,
    row: Row,
    bare: dict[bool, RabbitmqBroker],
    senders: dict[tuple[str, str], RabbitmqBroker],
    watch: Callable[[int], None] | None = None,
) -> Rate:
    """One throughput run of ``row``: bare Dramatiq's rows send through ``bare``, the project's
    through a broker of the row's status and queue shape, made once into ``senders``."""
    if row.module == "bench.bare":
        return run.throughput(row.label, row.module, bare[row.priority], row.make, watch, **row.env)
    url = STORES["redis"]
    shape = (row.env["JOB_STATUS"], row.env["RABBITMQ_MAX_PRIORITY"])
    if shape not in senders:
        senders[shape] = store_broker(url, JOB_STATUS=shape[0], RABBITMQ_MAX_PRIORITY=shape[1])
    return run.throughput(row.label, row.module, senders[shape], row.make, watch, STATE_URL=url, **row.env)


def cost_table(run: Run, bare: dict[bool, RabbitmqBroker], repeat: int) -> CostTable:
    """``repeat`` repetitions of every row, bare Dramatiq first, each printed as it completes;
    ``bare``: from :func:`bare_brokers`."""
    senders: dict[tuple[str, str], RabbitmqBroker] = {}
    table = CostTable()
    for i in range(repeat):
        done: dict[str, Rate] = {}
        for row in rows():
            rate = run_row(run, row, bare, senders)
            done[row.label] = rate
            table.add(rate, done[BARE], done[row.same or (BARE_PRIORITY if row.priority else BARE)])
            print(
                f"  [{i + 1}/{repeat}] {row.label:<42} {rate.per_second:>8,.0f} /s"
                f" {rate.per_second / done[BARE].per_second:>6.2f} {rate.cpu_micros_per_job:>7.0f} us"
                f" (RabbitMQ {rate.rabbitmq_micros_per_job:.0f}, Redis {rate.redis_micros_per_job:.0f};"
                f" machine idle {rate.idle_share:.0%}, stolen {rate.steal_share:.0%})",
                flush=True,
            )
    return table
