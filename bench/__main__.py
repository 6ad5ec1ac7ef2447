"""``python -m bench``: the cost table (bare Dramatiq, then the project's worker with each feature
added), send -> start latency, send rates, the scrubber's cost per log event, rate-limit overhead
and accuracy, dead letters and the dashboard.

Throughput runs are described in ``bench.throughput``, the cost table in ``bench.costs``, the
latency probe in ``bench.latency``. ``--repeat N`` repeats the cost table and the latency probes and
prints medians (3 by default); ``--costs-only`` stops after them. ``--profile ROW`` instead runs
one row of the cost table under py-spy and prints where its workers' time went (``bench.profile``);
``--only steps`` where an idle probe's send -> start time goes, step by step (``bench.latency_steps``);
``--only latency-features`` what each default feature costs it (``bench.latency_features``).
What the store's scripts cost Redis per job is counted in instructions, on a Redis of its own under
callgrind (``bench.store_instructions``; ``--only instructions``): within about 1.5% from run to
run, where CPU time on a small shared machine scatters by +-20%. Each part runs under a
``QUEUE_PREFIX`` of its own, whose state keys and delay cascade are deleted afterwards
(``bench.scratch``).

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
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

from dramatiq import Message
from dramatiq.brokers.rabbitmq import RabbitmqBroker

from bench import scratch
from bench.costs import BARE, STORES, bare_brokers, cost_table, store_broker
from bench.dashboard import add_dashboard_arguments, dashboard_report
from bench.dead_letters import dead_letter_figures
from bench.delays import delay_figures
from bench.scrub import scrub_costs
from bench.throughput import (
    BIN,
    ROOT,
    Rate,
    Run,
    delete_queues,
    keyed_messages,
    metered_messages,
    noop_messages,
)

#: ``--profile``: jobs queued per second sampled, so that most rows keep their workers busy that
#: long (a queue that drains early only leaves idle threads, which py-spy does not sample).
PROFILE_JOBS_PER_S = 6_000


#: The bench's buckets (RATE_LIMITS for the bench and its workers): one that never runs dry, one
#: paced (its rate and burst come from the command line), and smtp, which the email actor needs.
def bench_rate_limits(rate: float, burst: float) -> dict[str, dict[str, float]]:
    return {
        "smtp": {"rate": 100, "burst": 100},
        "bench-open": {"rate": 1e9, "burst": 1e9},
        "bench-paced": {"rate": rate, "burst": burst},
    }


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
    parser.add_argument(
        "--repeat", type=int, default=3, help="repetitions of the cost table (medians); 3 by default"
    )
    parser.add_argument("--latency-count", type=int, default=300, help="sequential latency probes")
    parser.add_argument("--costs-only", action="store_true", help="only the cost table and latency")
    parser.add_argument("--rate", type=float, default=100.0, help="paced bucket: tokens per second")
    parser.add_argument("--rate-burst", type=float, default=10.0, help="paced bucket: burst")
    parser.add_argument(
        "--rate-duration", type=float, default=30.0, help="seconds of paced jobs for the accuracy run"
    )
    parser.add_argument(
        "--only",
        choices=["delays", "instructions", "latency", "latency-features", "steps"],
        help="run only this bench",
    )
    parser.add_argument("--delay-count", type=int, default=10_000, help="delays bench: messages")
    parser.add_argument("--profile", metavar="ROW", help="py-spy one cost-table row (start of its label)")
    parser.add_argument("--profile-seconds", type=float, default=10.0, help="--profile: seconds sampled")
    parser.add_argument("--profile-gil", action="store_true", help="--profile: only samples holding the GIL")
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
    if args.only == "instructions":
        instructions_report()
        return
    with scratch.environment(STORES["redis"]) as prefix:
        print(f"scratch environment {prefix} (its queues, exchanges and state keys deleted at the end)")
        try:
            if args.profile:
                profile_report(args)
                return
            if args.only == "steps":
                steps_report(args)
                return
            if args.only in ("latency", "latency-features"):
                only_latency(args)
                return
            stack_figures(args)
        finally:
            delete_scratch_topology()
    if not args.costs_only:
        dashboard_report(STORES["redis"], args.dashboard_records)
        delay_report(args.delay_count)


def stack_figures(args: argparse.Namespace) -> None:
    """The cost table and latency, then (unless ``--costs-only``) the per-store, rate-limit, send
    and dead-letter figures."""
    from jobsystem.system import get_system

    brokers = bare_brokers(get_system().settings.rabbitmq_url)
    try:
        run = Run(args.count, args.processes, args.threads)
        bare = costs_and_latency(run, brokers, args)
        if args.costs_only:
            return
        print("scrubber cost per log event, in-process")
        for label, micros in scrub_costs():
            print(f"  {label:<52} {micros:>7.1f} us")
        instructions_report()
        keyed_figures(run, bare)
        rate_limit_figures(run, bare, args)
        send_figures(args.count)
        print("dead letters, 10,000")
        for label, figure in dead_letter_figures(10_000):
            print(f"  {label:<52} {figure:>12}")
    finally:
        for broker in brokers.values():
            broker.close()


def only_latency(args: argparse.Namespace) -> None:
    """``--only latency``: the send -> start latency lines alone (no cost table); ``--only
    latency-features``: what each default feature adds to the idle one."""
    from bench import latency_features
    from jobsystem.system import get_system

    brokers = bare_brokers(get_system().settings.rabbitmq_url)
    run = Run(args.count, args.processes, args.threads)
    try:
        if args.only == "latency":
            latency_report(run, brokers, args)
            return
        sender = partial(store_broker, STORES["redis"])
        count = max(args.latency_count * 2 // 3, 1)  # as the latency lines' idle probes
        for line in latency_features.report(brokers[False], sender, run, args.repeat, count):
            print(line, flush=True)
    finally:
        for broker in brokers.values():
            broker.close()


def delete_scratch_topology() -> None:
    """Delete the scratch environment's queues and exchanges, whichever part of the bench ran."""
    from jobsystem.system import get_system

    system = get_system()
    scratch.delete_topology(system.broker, system.settings)


def profile_report(args: argparse.Namespace) -> None:
    """``--profile ROW``: one row, on a queue of about as many jobs as bare Dramatiq runs in the
    sampled seconds (so the workers stay busy while sampled), summarized (``bench.profile``)."""
    from bench.profile import profile_row

    count = max(args.count, int(args.profile_seconds * PROFILE_JOBS_PER_S))
    run = Run(count, args.processes, args.threads)
    out, profile = profile_row(args.profile, run, args.profile_seconds, gil=args.profile_gil)
    print(f"profile of {args.profile!r}, {count:,} jobs, raw samples in {out}")
    for line in profile.lines():
        print(line)


def steps_report(args: argparse.Namespace) -> None:
    """``--only steps``: where an idle probe's send -> start time goes (``bench.latency_steps``)."""
    from bench.latency_steps import report

    for line in report(max(args.latency_count * 2 // 3, 1), args.processes, args.threads):
        print(line)


def instructions_report() -> None:
    """What the store's scripts cost Redis per job, in instructions (``bench.store_instructions``);
    left out, with a line saying so, where valgrind is not installed."""
    from bench.store_instructions import report

    try:
        lines = report()
    except RuntimeError as exc:
        lines = [f"Redis instructions per job: not measured ({exc})"]
    for line in lines:
        print(line)


def delay_report(count: int) -> None:
    print(f"delays, {count:,} messages, 1-120 s (about two minutes)")
    for line in delay_figures(count):
        print(line)


def costs_and_latency(run: Run, brokers: dict[bool, RabbitmqBroker], args: argparse.Namespace) -> Rate:
    """Print the cost table and the send -> start latency; return a bare Dramatiq rate."""
    load = os.getloadavg()
    print(
        f"cost table, {run.count:,} no-op jobs, {run.processes} processes x {run.threads} threads,"
        f" redis store, median of {args.repeat} (load averages {load[0]:.2f} {load[1]:.2f} {load[2]:.2f})"
    )
    table = cost_table(run, brokers, args.repeat)
    for line in table.lines():
        print(line)
    latency_report(run, brokers, args)
    return table.rates[BARE][-1]


def latency_report(run: Run, brokers: dict[bool, RabbitmqBroker], args: argparse.Namespace) -> None:
    """The send -> start latency of bare Dramatiq and the full stack (``bench.latency``)."""
    from bench.latency import report

    for line in report(brokers[False], store_broker(STORES["redis"]), run, args.repeat, args.latency_count):
        print(line, flush=True)


def ratio(label: str, value: float, digits: int = 2) -> str:
    return f"  {label:<44} {value:>9.{digits}f}"


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
    paced: list[Message[Any]] = [
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
