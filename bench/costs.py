"""The cost table: bare Dramatiq, then the project's worker with each feature added one at a time.

Every row runs the same queue shape and processes x threads as bare Dramatiq, in the same
invocation, on the Redis state store; it reports jobs/s, the ratio to bare of the same repetition,
the worker group's CPU per job and the CPU per job of the RabbitMQ and Redis servers, which share
the cores (see ``bench.throughput``). ``--repeat N`` prints the median of N repetitions of each
figure (ratios are taken within a repetition, then their median).

Measured for issue 15 (2 cores shared with two other sessions' test runs, so bare Dramatiq itself
ranged 4.7k-7.8k jobs/s; medians of 3, worker CPU us/job, before -> after; load averages 0.3-6.6
before, 1.9-5.3 after): bare 180 -> 186; everything off 236 -> 275 (ratio 0.82 -> 0.56, noise: the
off rows share no changed code but the consumer); + lifecycle logs 468 -> 474 (+232 -> +200);
+ job status 660 -> 551; + Prometheus 779 -> 574 (+119 -> +24); + key 1035 -> 687; + rate limit
1244 -> 915. Issue table, ratio to bare: full stack 0.13 -> 0.21, defaults 0.25 -> 0.35, all off
+ key + limit 0.32 -> 0.32, all off 0.82 -> 0.56. Send -> start latency, full stack / bare:
2.02 / 0.52 ms -> 2.96 / 0.69 ms (p99 6.8 -> 15.9 ms, bare 0.8 -> 2.9 ms).
An A/B of main against this branch, alternating, same minute (load 5-8.6): everything off 291, 266
-> 267, 280 us/job (unchanged: the 0.82 -> 0.56 above is noise); full stack 1131, 1124 -> 845, 953
us/job (-20%), 879, 901 -> 968, 990 jobs/s.

Token leases (issue 15, second part; two before/after pairs, main then the branch, medians of 3,
load averages 2.6-4.8 and 0.4-4.0): "defaults + key + rate-limited bucket" 799 -> 723 and 834 ->
614 us/job; the rate limit's increment over the key +129 -> -16 and +197 -> -55 (within noise:
the bucket that never runs dry now costs one store call per 32 jobs); ratio to bare 0.16 -> 0.33
and 0.21 -> 0.25. Paced bucket 100/s burst 10 (never leased): 1.0000-1.0020 of the rate on both.

Lifecycle lines in batches (issue 15, third part; 2 cores shared with two other sessions' tests
and a bench on main, load averages 4.3-17.7, so single figures swing by +-150 us/job): the rows
bare / everything off / + lifecycle logs, A/B alternating main, branch, main, branch, 3 repetitions
each (6 per side), "+ lifecycle logs" over "everything off", median of the per-repetition
increments: main +331 (172-456) -> branch +122 (-50-216) us/job; medians of the rows 660 -> 973
(main) and 640 -> 723 (branch). One full --costs-only --repeat 3 each, main then branch: +454
(off 756, logs 1210) -> +162 (off 679, logs 841) us/job; per repetition +537, +454, +389 ->
+121, +137, +183.

Session of 2026-12-01, all of the above merged plus acks in batches, hooks only where defined and
Heartbeat without a lock: three --costs-only runs of the commit before (0ec5690) and of the merged
main, alternating, helpers stopped (load averages 2.4-5.4, the bench itself making most of it);
medians, before -> after, worker CPU us/job: everything off 633 -> 492; + lifecycle logs 924 ->
490; + job status 1300 -> 742; defaults 1264 -> 915; defaults + key 1482 -> 1178; defaults + key +
rate-limited bucket 1501 -> 1149 (-23%); all off + key + limit 937 -> 812. Ratio to bare: full
stack 0.25 -> 0.27 (per run 0.22, 0.33, 0.27); defaults 0.30 -> 0.41; all off 0.62 -> 0.62 (0.62,
0.85, 0.56). Send -> start latency, full / bare: 4.27 / 0.96 ms (4.25x) -> 3.06 / 0.92 ms (3.54x);
p99 9.84 -> 6.93 ms. The issue's goals (0.6, 0.8, 1.5x) are still missed.

Second session of 2026-12-01, on a fresh machine (nothing else running but the bench; load
averages 0.7-4.5, the bench making them): the same before (f5c70e7, with this table's code) and
the merged main (status batches folded per record, lifecycle lines without structlog's chain, the
key taken once per delivery, ProjectMessage fields without __getattr__...), five --costs-only runs
each, alternating; medians, before -> after, worker CPU us/job: bare 122 / 119; everything off 136
-> 121; defaults 235 -> 172 (-27%); defaults + key 360 -> 244; full stack 334 -> 234 (-30%); all
off + key + limit 245 -> 181. Redis CPU per job, full stack 83 -> 56, + job status 64 -> 36.
Ratio to bare (noisy: bare itself ran 7.9k-13.9k jobs/s): full stack 0.30 -> 0.48 (per run 0.52,
0.32, 0.50, 0.32, 0.48); defaults 0.47 -> 0.61; all off 0.77 -> 0.87. Latency, full / bare: 1.14 /
0.34 ms (3.66x) -> 1.00 / 0.35 ms (2.99x). The goals are still missed.
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
