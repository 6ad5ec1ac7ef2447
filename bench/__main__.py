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

from bench.dead_letters import dead_letter_figures
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
    from actors.bulk import send_bulk
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
    import actors
    from actors.bulk import send_bulk

    broker = actors.broker
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
    parser.add_argument(
        "--dashboard-only",
        action="store_true",
        help="only the dashboard's latencies (1M records, 10k dead letters)",
    )
    parser.add_argument("--dashboard-records", type=int, default=1_000_000, help="status records seeded")
    args = parser.parse_args()
    if args.dashboard_only:
        dashboard_section(args.dashboard_records)
        return
    # Before ``import actors``: the settings (and the workers started below) see the bench's buckets.
    os.environ["RATE_LIMITS"] = json.dumps(bench_rate_limits(args.rate, args.rate_burst))

    import actors

    bare_broker = RabbitmqBroker(url=actors.settings.rabbitmq_url)
    print(f"throughput, {args.count:,} no-op jobs, {args.processes} processes x {args.threads} threads")
    bare = throughput(
        "bare Dramatiq, default middleware",
        "bench.bare",
        bare_broker,
        args.count,
        args.processes,
        args.threads,
    )
    print(bare.line())
    project = throughput(
        "this project's stack", "bench.project", actors.broker, args.count, args.processes, args.threads
    )
    print(project.line())
    print(f"  {'ratio project / bare':<44} {project.per_second / bare.per_second:>9.2f}")
    logged = throughput(
        "project's stack, lifecycle logs (INFO, JSON)",
        "bench.project",
        actors.broker,
        args.count,
        args.processes,
        args.threads,
        LOG_LEVEL="INFO",
        LOG_FORMAT="json",
    )
    print(logged.line())
    print(f"  {'ratio logged / project':<44} {logged.per_second / project.per_second:>9.2f}")

    print("scrubber cost per log event, in-process")
    for label, micros in scrub_costs():
        print(f"  {label:<52} {micros:>7.1f} us")

    print("idempotency keys on (one claim per job, completion marks deferred)")
    stores = {"redis": "redis://127.0.0.1:6379/14", "sqlite": f"sqlite:///{ROOT}/var/bench-state.db"}
    for name, url in stores.items():
        keyed_broker = store_broker(url)
        keyed = throughput(
            f"keyed no-op jobs, {name} store",
            "bench.project",
            keyed_broker,
            args.count,
            args.processes,
            args.threads,
            keyed_messages,
            STATE_URL=url,
        )
        print(keyed.line())
        print(f"  {'ratio keyed (' + name + ') / bare':<44} {keyed.per_second / bare.per_second:>9.2f}")

    print("job status tracking (queued at send, running, succeeded: deferred, batched writes)")
    untracked = throughput(
        "project stack, status off",
        "bench.project",
        store_broker(stores["redis"], JOB_STATUS="false"),
        args.count,
        args.processes,
        args.threads,
        STATE_URL=stores["redis"],
        JOB_STATUS="false",
    )
    print(untracked.line())
    for name, url in stores.items():
        tracked = throughput(
            f"project stack, status on, {name} store",
            "bench.project",
            store_broker(url),
            args.count,
            args.processes,
            args.threads,
            STATE_URL=url,
            JOB_STATUS="true",
        )
        print(tracked.line())
        for against, rate in (("off", untracked), ("bare", bare)):
            label = f"ratio status on ({name}) / {against}"
            print(f"  {label:<44} {tracked.per_second / rate.per_second:>9.2f}")

    print("rate limits (a token taken per job, state store round trips coalesced)")
    for name, url in stores.items():
        metered = throughput(
            f"unconstrained bucket, {name} store",
            "bench.project",
            store_broker(url),
            args.count,
            args.processes,
            args.threads,
            metered_messages,
            STATE_URL=url,
        )
        print(metered.line())
        ratio = metered.per_second / bare.per_second
        print(f"  {'ratio unconstrained (' + name + ') / bare':<44} {ratio:>9.2f}")
    for line in rate_accuracy(
        stores["redis"], args.rate, args.rate_burst, args.rate_duration, args.processes, args.threads
    ):
        print(line)

    print(f"send rate, {args.count:,} messages, publisher confirms on")
    loop, bulk = send_rates(args.count)
    print(loop.line())
    print(bulk.line())
    print(f"  {'ratio bulk / loop':<44} {bulk.per_second / loop.per_second:>9.1f}")
    for name, url in stores.items():
        print(
            dedup_send_rate(
                f"send_bulk() with dedup at send, {name} store", store_broker(url), args.count
            ).line()
        )

    print("dead letters, 10,000")
    for label, figure in dead_letter_figures(10_000):
        print(f"  {label:<52} {figure:>12}")
    bare_broker.close()
    dashboard_section(args.dashboard_records)


def dashboard_section(records: int) -> None:
    from bench.dashboard import dashboard_figures

    print(f"dashboard: 50 queues, {records:,} status records, 10,000 dead letters (Redis store)")
    for line in dashboard_figures("redis://127.0.0.1:6379/14", records):
        print(line)


def store_broker(state_url: str, **env: str) -> RabbitmqBroker:
    """The project's broker and middleware on ``state_url`` (other settings from ``env``), knowing
    the bench's keyed actor."""
    import actors
    import bench.project
    from actors.broker import build_broker
    from actors.settings import load_settings
    from actors.stack import build_middleware
    from middleware.state import open_store

    settings = load_settings({**os.environ, "STATE_URL": state_url, **env})
    store = open_store(settings.state_url, namespace=settings.state_namespace)
    broker = build_broker(settings, build_middleware(settings, store), store)
    broker.actors.update(actors.broker.actors)
    broker.actors["keyed_noop"] = bench.project.keyed_noop
    broker.actors["metered_noop"] = bench.project.metered_noop
    broker.actors["paced_noop"] = bench.project.paced_noop
    return broker


def rate_accuracy(
    state_url: str, rate: float, burst: float, duration: float, processes: int, threads: int
) -> list[str]:
    """Run ``rate * duration + burst`` paced jobs through a fresh bucket; report the pace kept."""
    import redis

    import actors
    from actors.bulk import send_bulk
    from middleware.ratelimit_store import bucket_backend
    from middleware.state import open_store

    count = int(rate * duration + burst)
    broker = store_broker(state_url)
    # A full bucket to start from, whatever an earlier run left.
    bucket_backend(open_store(state_url, namespace=actors.settings.state_namespace)).reset("bench-paced")
    run = uuid.uuid4().hex[:8]
    queue, starts_key = f"bench-{run}", f"bench:starts:{run}"
    broker.declare_queue(queue, ensure=True)
    send_bulk(
        [
            Message(queue_name=queue, actor_name="paced_noop", args=(), kwargs={}, options={})
            for _ in range(count)
        ],
        broker=broker,
    )
    client = redis.Redis.from_url("redis://127.0.0.1:6379/14")
    env = {
        **os.environ,
        "BENCH_QUEUE": queue,
        "BENCH_STARTS_KEY": starts_key,
        "STATE_URL": state_url,
        "LOG_LEVEL": "WARNING",
    }
    worker = subprocess.Popen(
        [str(BIN / "dramatiq"), "bench.project", "-p", str(processes), "-t", str(threads)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + duration * 2 + 60
        while client.llen(starts_key) < count and time.monotonic() < deadline:
            time.sleep(0.2)
        times = sorted(float(t) for t in client.lrange(starts_key, 0, -1))
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
        client.delete(starts_key)
        delete_queues(broker, queue)
    if len(times) < count:
        return [f"  paced bucket: only {len(times)} of {count} jobs started in time"]
    observed = (count - burst) / (times[-1] - times[0])
    off = abs(observed / rate - 1)
    # The busiest one-second window, against the bucket's bound burst + rate * 1 s.
    busiest, j = 0, 0
    for i, t in enumerate(times):
        while times[j] < t - 1.0:
            j += 1
        busiest = max(busiest, i - j + 1)
    label = f"paced bucket {rate:g}/s burst {burst:g}, {count:,} jobs"
    return [
        f"  {label:<44} {observed:>9,.2f} /s   ({times[-1] - times[0]:.1f} s)",
        f"  {'observed / configured rate':<44} {observed / rate:>9.4f}   (off by {off:.2%})",
        f"  {'busiest 1 s window (bound burst + rate)':<44} {busiest:>9}   (bound {burst + rate:g})",
    ]


def dedup_send_rate(label: str, broker: RabbitmqBroker, count: int) -> Rate:
    """A bulk send of keyed messages: one pipelined key registration, then pipelined confirms."""
    from actors.bulk import send_bulk

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
