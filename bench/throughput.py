"""One throughput run: a pre-filled queue, a real ``dramatiq`` worker, jobs/s and worker CPU per job.

Each run pre-fills a fresh queue with N messages, starts ``dramatiq MODULE -p P -t T`` (the same
processes x threads for bare Dramatiq and the project), and times the queue to empty from the
moment the worker group has booted and taken its first messages: every worker process consumes the
queue (its consumer count), and the ``/metrics`` process answers when the row serves one. What the
group spends once, starting, is thus outside the window, as it is outside a long-running worker's
steady state: the metrics process imported the project's modules during the first seconds of a
6-12 s window, 0.3-0.5 s of CPU on this 2-core machine (about 50 us per job of the defaults' row).
The few messages still prefetched when the queue reads empty (at most processes x threads x 2) are
within a fraction of a percent at the default N. Worker CPU is the sum of
utime + stime of the worker group (the ``dramatiq`` process and its descendants, from
``/proc/PID/stat``) over the same window, divided by the jobs taken in it; so are the CPU of
RabbitMQ's and Redis's server processes (found by name in ``/proc``; 0 when not on this host), which
share the machine's cores with the workers. How busy the machine was over the window comes from
``/proc/stat``: the share of its CPU time left idle (a row that leaves much idle is waiting, not
computing) and the share stolen by the hypervisor for other guests (a noisy neighbour).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dramatiq import Message
from dramatiq.brokers.rabbitmq import RabbitmqBroker

__all__ = [
    "BIN",
    "ROOT",
    "MachineTimes",
    "Rate",
    "Run",
    "delete_queues",
    "group_cpu_seconds",
    "keyed_messages",
    "machine_times",
    "messages_of",
    "metered_messages",
    "noop_messages",
    "throughput",
]

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
_TICKS = os.sysconf("SC_CLK_TCK")
#: How long a worker group may take to boot before a run gives up.
BOOT_TIMEOUT_S = 120


@dataclass
class Rate:
    label: str
    count: int
    seconds: float
    cpu_seconds: float = 0.0
    #: CPU seconds of the RabbitMQ and Redis servers over the same window.
    rabbitmq_cpu_seconds: float = 0.0
    redis_cpu_seconds: float = 0.0
    #: Shares of the machine's CPU time over the same window left idle, and stolen by the hypervisor.
    idle_share: float = 0.0
    steal_share: float = 0.0

    @property
    def per_second(self) -> float:
        return self.count / self.seconds

    @property
    def cpu_micros_per_job(self) -> float:
        return self.cpu_seconds / self.count * 1e6

    @property
    def rabbitmq_micros_per_job(self) -> float:
        return self.rabbitmq_cpu_seconds / self.count * 1e6

    @property
    def redis_micros_per_job(self) -> float:
        return self.redis_cpu_seconds / self.count * 1e6

    def line(self) -> str:
        return f"  {self.label:<44} {self.per_second:>9,.0f} /s   ({self.count:,} in {self.seconds:.2f} s)"


@dataclass(frozen=True)
class MachineTimes:
    """The machine's CPU time so far (all cores, clock ticks): idle (with I/O wait), stolen by
    the hypervisor for other guests, and in all; differences of two give a window's shares."""

    idle: int
    steal: int
    total: int

    def __sub__(self, earlier: MachineTimes) -> MachineTimes:
        return MachineTimes(self.idle - earlier.idle, self.steal - earlier.steal, self.total - earlier.total)

    @property
    def idle_share(self) -> float:
        return self.idle / self.total if self.total > 0 else 0.0

    @property
    def steal_share(self) -> float:
        return self.steal / self.total if self.total > 0 else 0.0

    @classmethod
    def parse(cls, stat: str) -> MachineTimes:
        """From ``/proc/stat``'s first line: ``cpu user nice system idle iowait irq softirq steal
        guest guest_nice`` (guest time is counted in user and nice already, so left out of the total)."""
        fields = [int(value) for value in stat.split()[1:9]]
        fields += [0] * (8 - len(fields))  # older kernels give fewer fields
        return cls(idle=fields[3] + fields[4], steal=fields[7], total=sum(fields))


def machine_times() -> MachineTimes:
    """The machine's CPU times so far (zeros where ``/proc/stat`` cannot be read)."""
    try:
        with open("/proc/stat") as stat:
            return MachineTimes.parse(stat.readline())
    except (OSError, ValueError):
        return MachineTimes(0, 0, 0)


def delete_queues(broker: RabbitmqBroker, queue: str) -> None:
    """Remove a bench queue and its companions (delay, dead letters, and Dramatiq's own .XQ)."""
    for name in (queue, f"{queue}.DQ", f"{queue}.DLQ", f"{queue}.XQ"):
        broker.channel.queue_delete(name)


def messages_of(actor: str) -> Callable[[str, int], list[Message[Any]]]:
    """A factory of ``count`` argument-less messages of ``actor``."""

    def make(queue: str, count: int) -> list[Message[Any]]:
        return [
            Message(queue_name=queue, actor_name=actor, args=(), kwargs={}, options={}) for _ in range(count)
        ]

    return make


noop_messages = messages_of("noop")
#: No-op messages of an actor that takes a token of an unconstrained bucket first.
metered_messages = messages_of("metered_noop")


def keyed_messages(queue: str, count: int, actor: str = "keyed_noop") -> list[Message[Any]]:
    """No-op messages each with its own idempotency key (the actor computes it from its argument)."""
    run = uuid.uuid4().hex[:8]
    return [
        Message(queue_name=queue, actor_name=actor, args=(f"{run}-{i}",), kwargs={}, options={})
        for i in range(count)
    ]


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            found += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
        except OSError:
            continue
    return found


def group_cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` and all its descendants, in seconds (0 for those gone)."""
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        try:
            stat = Path(f"/proc/{current}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
        todo += _children(current)
    return total / _TICKS


def server_pids(name: str) -> list[int]:
    """The pids of processes whose command name is ``name`` (e.g. ``beam.smp``, ``redis-server``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == name:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def servers_cpu_seconds() -> tuple[float, float]:
    """CPU seconds so far of the RabbitMQ (``beam.smp``) and Redis server processes on this host."""
    rabbitmq = sum(group_cpu_seconds(pid) for pid in server_pids("beam.smp"))
    redis = sum(group_cpu_seconds(pid) for pid in server_pids("redis-server"))
    return rabbitmq, redis


def depth(broker: RabbitmqBroker, queue: str) -> int:
    """Ready messages of ``queue`` (not those prefetched by a worker)."""
    return int(broker.channel.queue_declare(queue, passive=True).method.message_count)


def _wait_for_boot(
    label: str,
    worker: subprocess.Popen[bytes],
    broker: RabbitmqBroker,
    queue: str,
    run: Run,
    metrics_port: str,
) -> int:
    """Wait until the worker group has booted (every process consumes ``queue``, the ``/metrics``
    process answers on ``metrics_port`` unless it is "0") and taken its first messages; the
    messages left then. Raises when the group exits, does not boot within
    :data:`BOOT_TIMEOUT_S`, or takes the whole queue first (the run is too short to measure)."""
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    metrics_answered = metrics_port == "0"
    while True:
        state = broker.channel.queue_declare(queue, passive=True).method
        metrics_answered = metrics_answered or _answers(metrics_port)
        if state.consumer_count >= run.processes and metrics_answered and state.message_count < run.count:
            break
        if worker.poll() is not None:
            raise RuntimeError(f"{label}: the worker group exited with {worker.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{label}: the worker group did not boot within {BOOT_TIMEOUT_S} s (all {run.processes}"
                f" processes consuming, /metrics answering on port {metrics_port} unless it is 0)"
            )
        time.sleep(0.01)
    if state.message_count == 0:
        raise RuntimeError(f"{label}: the queue was empty once the group had booted; raise the count")
    return int(state.message_count)


def _answers(port: str) -> bool:
    """Whether something answers HTTP on ``127.0.0.1:port/metrics`` (an error is an answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


def throughput(
    label: str,
    module: str,
    broker: RabbitmqBroker,
    run: Run,
    make_messages: Callable[[str, int], list[Message[Any]]] = noop_messages,
    watch: Callable[[int], None] | None = None,
    **env_overrides: str,
) -> Rate:
    """Fill a fresh queue, run ``dramatiq MODULE`` on it, time it from the booted group's first take to empty.

    The worker logs at WARNING unless ``env_overrides`` say otherwise (its output is discarded).
    ``watch``, when given, is called with the group's pid once it has booted, inside the window (a
    profiler: the run's rate is then not a figure).
    """
    from jobsystem.rabbitmq.bulk import send_bulk
    from middleware.status import find_status

    count = run.count
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    broker.declare_queue(queue, ensure=True)
    send_bulk(make_messages(queue, count), broker=broker)
    status = find_status(broker)
    if status is not None:
        status.flush(120)  # the "queued" records are written before the clock starts
    env = {**os.environ, "BENCH_QUEUE": queue, "LOG_LEVEL": "WARNING", **env_overrides}
    worker = subprocess.Popen(
        [str(BIN / "dramatiq"), module, "-p", str(run.processes), "-t", str(run.threads)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        left = _wait_for_boot(label, worker, broker, queue, run, env_overrides.get("PROMETHEUS_PORT", "0"))
        started, at_start, cpu_start = time.perf_counter(), left, group_cpu_seconds(worker.pid)
        servers_start, machine_start = servers_cpu_seconds(), machine_times()
        if watch is not None:
            watch(worker.pid)
        while depth(broker, queue) > 0:
            time.sleep(0.02)
        elapsed, cpu = time.perf_counter() - started, group_cpu_seconds(worker.pid) - cpu_start
        servers = [end - begin for begin, end in zip(servers_start, servers_cpu_seconds(), strict=True)]
        machine = machine_times() - machine_start
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
        delete_queues(broker, queue)
        # Idle until the broker's next row, its connection would miss RabbitMQ's heartbeats
        # (a blocking connection answers them only while used) and be reset: reconnect then.
        del broker.connection
    rabbitmq, redis = servers
    return Rate(label, at_start, elapsed, cpu, rabbitmq, redis, machine.idle_share, machine.steal_share)


@dataclass(frozen=True)
class Run:
    """The size and shape of every throughput run."""

    count: int
    processes: int
    threads: int

    def throughput(
        self,
        label: str,
        module: str,
        broker: RabbitmqBroker,
        make_messages: Callable[[str, int], list[Message[Any]]] = noop_messages,
        watch: Callable[[int], None] | None = None,
        **env: str,
    ) -> Rate:
        return throughput(label, module, broker, self, make_messages, watch, **env)
