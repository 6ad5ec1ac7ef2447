"""``python -m bench``: throughput of bare Dramatiq against this project's stack (with and without
lifecycle logging), send rates, and the scrubber's cost per log event.

Each throughput run pre-fills a fresh queue with N no-op messages, starts a real ``dramatiq``
worker (same processes x threads for both), and times the queue from the first message taken to
empty. The few messages still prefetched when the queue reads empty (at most processes x threads
x 2) are within a fraction of a percent at the default N.

Rate limits: the overhead of a bucket that never runs dry (a take per job) as a ratio of bare
throughput, and the accuracy of a paced bucket: enough jobs for ``--rate-duration`` seconds at
``--rate`` per second, their start times noted by the actor; the observed rate is
``(jobs - burst) / (last start - first start)`` (a full bucket lets ``burst`` go at once).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dramatiq import Message
from dramatiq.brokers.rabbitmq import RabbitmqBroker

from bench.dashboard import add_dashboard_arguments, dashboard_report
from bench.dead_letters import dead_letter_figures
from bench.delays import delay_figures
from bench.scrub import scrub_costs

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


@dataclass
class Rate:
    label: str
    count: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.count / self.seconds

    def line(self) -> str:
        return f"  {self.label:<44} {self.per_second:>9,.0f} /s   ({self.count:,} in {self.seconds:.2f} s)"


def delete_queues(broker: RabbitmqBroker, queue: str) -> None:
    """Remove a bench queue and its companions (delay, dead letters, and Dramatiq's own .XQ)."""
    for name in (queue, f"{queue}.DQ", f"{queue}.DLQ", f"{queue}.XQ"):
        broker.channel.queue_delete(name)


def noop_messages(queue: str, count: int) -> list[Message[Any]]:
    return [
        Message(queue_name=queue, actor_name="noop", args=(), kwargs={}, options={}) for _ in range(count)
    ]


def keyed_messages(queue: str, count: int) -> list[Message[Any]]:
    """No-op messages each with its own idempotency key (the actor computes it from its argument)."""
    run = uuid.uuid4().hex[:8]
    return [
        Message(queue_name=queue, actor_name="keyed_noop", args=(f"{run}-{i}",), kwargs={}, options={})
        for i in range(count)
    ]


def metered_messages(queue: str, count: int) -> list[Message[Any]]:
    """No-op messages of an actor that takes a token of an unconstrained bucket first."""
    return [
        Message(queue_name=queue, actor_name="metered_noop", args=(), kwargs={}, options={})
        for _ in range(count)
    ]


#: The bench's buckets (RATE_LIMITS for the bench and its workers): one that never runs dry, one
#: paced (its rate and burst come from the command line), and smtp, which the email actor needs.
def bench_rate_limits(rate: float, burst: float) -> dict[str, dict[str, float]]:
    return {
        "smtp": {"rate": 100, "burst": 100},
        "bench-open": {"rate": 1e9, "burst": 1e9},
        "bench-paced": {"rate": rate, "burst": burst},
    }


def depth(broker: RabbitmqBroker, queue: str) -> int:
    return int(broker.channel.queue_declare(queue, passive=True).method.message_count)


def throughput(
    label: str,
    module: str,
    broker: RabbitmqBroker,
    count: int,
    processes: int,
    threads: int,
    make_messages: Callable[[str, int], list[Message[Any]]] = noop_messages,
    **env_overrides: str,
) -> Rate:
    """Fill a fresh queue, run ``dramatiq MODULE`` on it, time it from first take to empty.

    The worker logs at WARNING unless ``env_overrides`` say otherwise (its output is discarded).
    """
    from jobsystem.rabbitmq.bulk import send_bulk
    from middleware.status import find_status

    queue = f"bench-{uuid.uuid4().hex[:8]}"
    broker.declare_queue(queue, ensure=True)
    send_bulk(make_messages(queue, count), broker=broker)
    status = find_status(broker)
    if status is not None:
        status.flush(120)  # the "queued" records are written before the clock starts
    env = {**os.environ, "BENCH_QUEUE": queue, "LOG_LEVEL": "WARNING", **env_overrides}
    worker = subprocess.Popen(
        [str(BIN / "dramatiq"), module, "-p", str(processes), "-t", str(threads)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while (left := depth(broker, queue)) >= count:
            time.sleep(0.01)
        started, at_start = time.perf_counter(), left
        while depth(broker, queue) > 0:
            time.sleep(0.02)
        elapsed = time.perf_counter() - started
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
        delete_queues(broker, queue)
    return Rate(label, at_start, elapsed)


def send_rates(count: int) -> tuple[Rate, Rate]:
    """``send()`` in a loop (one confirm per message) against one bulk send with pipelined confirms."""
    from jobsystem.rabbitmq.bulk import send_bulk
    from jobsystem.system import get_system

    broker = get_system().broker
    queue = f"bench-send-{uuid.uuid4().hex[:8]}"
    broker.declare_queue(queue, ensure=True)
    loop_count = max(count // 10, 500)
    started = time.perf_counter()
    for message in noop_messages(queue, loop_count):
        broker.enqueue(message)
    loop = Rate("send() in a loop, confirm per message", loop_count, time.perf_counter() - started)
    messages = noop_messages(queue, count)
    started = time.perf_counter()
    send_bulk(messages)
    bulk = Rate("send_bulk(), pipelined confirms", count, time.perf_counter() - started)
    delete_queues(broker, queue)
    return loop, bulk


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("-n", "--count", type=int, default=int(os.environ.get("BENCH_COUNT", 20_000)))
    parser.add_argument("-p", "--processes", type=int, default=2)
    parser.add_argument("-t", "--threads", type=int, default=8)
    parser.add_argument("--rate", type=float, default=100.0, help="paced bucket: tokens per second")
    parser.add_argument("--rate-burst", type=float, default=10.0, help="paced bucket: burst")
    parser.add_argument(
        "--rate-duration", type=float, default=30.0, help="seconds of paced jobs for the accuracy run"
    )
    parser.add_argument("--only", choices=["delays"], help="run only this bench")
    parser.add_argument("--delay-count", type=int, default=10_000, help="delays bench: messages")
    add_dashboard_arguments(parser)
    args = parser.parse_args()
    if args.dashboard_only:
        dashboard_report(STORES["redis"], args.dashboard_records)
        return
    # Before the system is built: the settings (and the workers started below) see the bench's buckets.
    os.environ["RATE_LIMITS"] = json.dumps(bench_rate_limits(args.rate, args.rate_burst))
    if args.only == "delays":
        delay_report(args.delay_count)
        return
    from jobsystem.system import get_system

    bare_broker = RabbitmqBroker(url=get_system().settings.rabbitmq_url)
    run = Run(args.count, args.processes, args.threads)
    bare = stack_figures(run, bare_broker)
    print("scrubber cost per log event, in-process")
    for label, micros in scrub_costs():
        print(f"  {label:<52} {micros:>7.1f} us")
    keyed_figures(run, bare)
    status_figures(run, bare)
    rate_limit_figures(run, bare, args)
    send_figures(args.count)
    print("dead letters, 10,000")
    for label, figure in dead_letter_figures(10_000):
        print(f"  {label:<52} {figure:>12}")
    bare_broker.close()
    dashboard_report(STORES["redis"], args.dashboard_records)
    delay_report(args.delay_count)


def delay_report(count: int) -> None:
    print(f"delays, {count:,} messages, 1-120 s (about two minutes)")
    for line in delay_figures(count):
        print(line)


#: The two state stores the figures are taken on.
STORES = {"redis": "redis://127.0.0.1:6379/14", "sqlite": f"sqlite:///{ROOT}/var/bench-state.db"}


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
        **env: str,
    ) -> Rate:
        return throughput(
            label, module, broker, self.count, self.processes, self.threads, make_messages, **env
        )


def ratio(label: str, value: float, digits: int = 2) -> str:
    return f"  {label:<44} {value:>9.{digits}f}"


def stack_figures(run: Run, bare_broker: RabbitmqBroker) -> Rate:
    """Bare Dramatiq, the project's stack, and the stack with lifecycle logs; returns bare's rate."""
    from jobsystem.system import get_system

    broker = get_system().broker
    print(f"throughput, {run.count:,} no-op jobs, {run.processes} processes x {run.threads} threads")
    bare = run.throughput("bare Dramatiq, default middleware", "bench.bare", bare_broker)
    print(bare.line())
    project = run.throughput("this project's stack", "bench.project", broker)
    print(project.line())
    print(ratio("ratio project / bare", project.per_second / bare.per_second))
    logged = run.throughput(
        "project's stack, lifecycle logs (INFO, JSON)",
        "bench.project",
        broker,
        LOG_LEVEL="INFO",
        LOG_FORMAT="json",
    )
    print(logged.line())
    print(ratio("ratio logged / project", logged.per_second / project.per_second))
    return bare


def per_store(
    run: Run, bare: Rate, label: str, make_messages: Callable[[str, int], list[Message[Any]]]
) -> None:
    """``label``'s jobs (``make_messages``) on each state store, and their ratio to bare Dramatiq."""
    for name, url in STORES.items():
        rate = run.throughput(
            f"{label}, {name} store", "bench.project", store_broker(url), make_messages, STATE_URL=url
        )
        print(rate.line())
        print(ratio(f"ratio {label.split()[0]} ({name}) / bare", rate.per_second / bare.per_second))


def keyed_figures(run: Run, bare: Rate) -> None:
    print("idempotency keys on (one claim per job, completion marks deferred)")
    per_store(run, bare, "keyed no-op jobs", keyed_messages)


def status_figures(run: Run, bare: Rate) -> None:
    print("job status tracking (queued at send, running, succeeded: deferred, batched writes)")
    redis_url = STORES["redis"]
    off = store_broker(redis_url, JOB_STATUS="false")
    untracked = run.throughput(
        "project stack, status off", "bench.project", off, STATE_URL=redis_url, JOB_STATUS="false"
    )
    print(untracked.line())
    for name, url in STORES.items():
        label = f"project stack, status on, {name} store"
        tracked = run.throughput(label, "bench.project", store_broker(url), STATE_URL=url, JOB_STATUS="true")
        print(tracked.line())
        for against, rate in (("off", untracked), ("bare", bare)):
            print(ratio(f"ratio status on ({name}) / {against}", tracked.per_second / rate.per_second))


def rate_limit_figures(run: Run, bare: Rate, args: argparse.Namespace) -> None:
    print("rate limits (a token taken per job, state store round trips coalesced)")
    per_store(run, bare, "unconstrained bucket", metered_messages)
    for line in rate_accuracy(STORES["redis"], args.rate, args.rate_burst, args.rate_duration, run):
        print(line)


def send_figures(count: int) -> None:
    print(f"send rate, {count:,} messages, publisher confirms on")
    loop, bulk = send_rates(count)
    print(loop.line())
    print(bulk.line())
    print(ratio("ratio bulk / loop", bulk.per_second / loop.per_second, 1))
    for name, url in STORES.items():
        print(
            dedup_send_rate(f"send_bulk() with dedup at send, {name} store", store_broker(url), count).line()
        )


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


def rate_accuracy(state_url: str, rate: float, burst: float, duration: float, run: Run) -> list[str]:
    """Run ``rate * duration + burst`` paced jobs through a fresh bucket; report the pace kept."""
    from jobsystem.store import open_store
    from jobsystem.store.buckets import bucket_backend
    from jobsystem.system import get_system

    count = int(rate * duration + burst)
    # A full bucket to start from, whatever an earlier run left.
    namespace = get_system().settings.state_namespace
    bucket_backend(open_store(state_url, namespace=namespace)).reset("bench-paced")
    times = paced_starts(state_url, count, duration * 2 + 60, run)
    if len(times) < count:
        return [f"  paced bucket: only {len(times)} of {count} jobs started in time"]
    observed = (count - burst) / (times[-1] - times[0])
    off, busiest = abs(observed / rate - 1), busiest_second(times)
    label = f"paced bucket {rate:g}/s burst {burst:g}, {count:,} jobs"
    return [
        f"  {label:<44} {observed:>9,.2f} /s   ({times[-1] - times[0]:.1f} s)",
        f"  {'observed / configured rate':<44} {observed / rate:>9.4f}   (off by {off:.2%})",
        f"  {'busiest 1 s window (bound burst + rate)':<44} {busiest:>9}   (bound {burst + rate:g})",
    ]


def paced_starts(state_url: str, count: int, timeout: float, run: Run) -> list[float]:
    """Send ``count`` paced jobs, run a worker until they all started (or ``timeout`` seconds),
    and return their start times, sorted."""
    import redis

    from jobsystem.rabbitmq.bulk import send_bulk

    broker = store_broker(state_url)
    queue, starts_key = f"bench-{uuid.uuid4().hex[:8]}", f"bench:starts:{uuid.uuid4().hex[:8]}"
    broker.declare_queue(queue, ensure=True)
    paced = [
        Message(queue_name=queue, actor_name="paced_noop", args=(), kwargs={}, options={})
        for _ in range(count)
    ]
    send_bulk(paced, broker=broker)
    client = redis.Redis.from_url("redis://127.0.0.1:6379/14")
    env = {**os.environ, "BENCH_QUEUE": queue, "BENCH_STARTS_KEY": starts_key, "STATE_URL": state_url}
    worker = subprocess.Popen(
        [str(BIN / "dramatiq"), "bench.project", "-p", str(run.processes), "-t", str(run.threads)],
        cwd=ROOT,
        env={**env, "LOG_LEVEL": "WARNING"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + timeout
        while client.llen(starts_key) < count and time.monotonic() < deadline:
            time.sleep(0.2)
        return sorted(float(t) for t in client.lrange(starts_key, 0, -1))
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
        client.delete(starts_key)
        delete_queues(broker, queue)


def busiest_second(times: list[float]) -> int:
    """The most starts within any one-second window of the sorted ``times``."""
    busiest, j = 0, 0
    for i, t in enumerate(times):
        while times[j] < t - 1.0:
            j += 1
        busiest = max(busiest, i - j + 1)
    return busiest


def dedup_send_rate(label: str, broker: RabbitmqBroker, count: int) -> Rate:
    """A bulk send of keyed messages: one pipelined key registration, then pipelined confirms."""
    from jobsystem.rabbitmq.bulk import send_bulk

    queue = f"bench-send-{uuid.uuid4().hex[:8]}"
    broker.declare_queue(queue, ensure=True)
    messages = keyed_messages(queue, count)
    started = time.perf_counter()
    send_bulk(messages, broker=broker)
    rate = Rate(label, count, time.perf_counter() - started)
    delete_queues(broker, queue)
    return rate


if __name__ == "__main__":
    main()
