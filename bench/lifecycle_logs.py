"""CPU per job of the lifecycle log events, measured in-process: ``python -m bench.lifecycle_logs``.

Logging is set up as ``configure_logging`` does at the defaults (JSON, INFO, the project's
scrubber), with one root ``StreamHandler`` on an in-memory stream, or on a :class:`BatchedStream`
over a pipe-like sink (a worker process's set-up). ``JobLifecycle``'s ``before_process_message`` and
``after_process_message`` run on a Dramatiq ``MessageProxy`` of a no-op message, each time with a
new message id, as a worker's jobs have: ``job_started`` and ``job_succeeded`` per job, and nothing
else. ``time.process_time()`` over ``count`` jobs, divided by ``count``; the median of ``runs``.
µs per event: the job's cost less that of the hooks with events that write nothing, halved.

Measured when ``JobLifecycle`` began to write these lines itself (``job_lines``; 2 cores, load
1-3, 20,000 jobs, median of 5, main's code against the branch's in the same minute): StringIO
handler 26.0 -> 20.2 µs per job, 10.1 -> 7.2 µs per event; batched pipe 25.2 -> 19.5 µs per job,
9.8 -> 6.9 µs per event (the hooks without their lines: 5.7 µs per job).
"""

from __future__ import annotations

import argparse
import io
import logging
import statistics
import time
import uuid
from typing import Any

import dramatiq
import structlog
from dramatiq.broker import MessageProxy
from dramatiq.brokers.stub import StubBroker

from jobsystem.observability.batched_stream import BatchedStream
from jobsystem.observability.job_lines import write_job_line
from jobsystem.observability.logs import configure_logging
from jobsystem.privacy.setup import get_scrubber
from jobsystem.settings import load_settings
from middleware.lifecycle import JobLifecycle

__all__ = ["lifecycle_cost"]


class _Sink:
    """Takes what a pipe to Dramatiq's parent would, and forgets it."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


def _configure(stream: str, short: bool) -> tuple[JobLifecycle, StubBroker]:
    settings = load_settings({"LOG_FORMAT": "json", "LOG_LEVEL": "INFO"})
    root = logging.getLogger()
    target: Any = io.StringIO() if stream == "memory" else BatchedStream(_Sink(), interval=600)
    root.handlers = [logging.StreamHandler(target)]
    configure_logging(settings)
    broker = StubBroker()
    dramatiq.set_broker(broker)

    @dramatiq.actor(queue_name="bench", broker=broker)
    def noop() -> None:
        pass

    # As the stack builds it; without ``write_line``, each event goes through structlog's chain.
    lifecycle = JobLifecycle(scrub=get_scrubber(settings), write_line=write_job_line if short else None)
    return lifecycle, broker


def _per_job_us(lifecycle: JobLifecycle, broker: StubBroker, count: int) -> float:
    messages = [MessageProxy(dramatiq.Message("bench", "noop", (), {}, {})) for _ in range(count)]
    for message in messages:
        message._message = message._message.copy(message_id=str(uuid.uuid4()))
    root = logging.getLogger()
    started = time.process_time()
    for message in messages:
        lifecycle.before_process_message(broker, message)
        lifecycle.after_process_message(broker, message, result=None)
    elapsed = time.process_time() - started
    stream = root.handlers[0].stream  # type: ignore[attr-defined]
    if isinstance(stream, io.StringIO):
        stream.seek(0)
        stream.truncate()
    return elapsed / count * 1e6


def lifecycle_cost(
    stream: str = "memory", path: str = "job_lines", count: int = 20_000, runs: int = 5
) -> tuple[float, list[float]]:
    """Median µs per job and every run's figure. ``path``: ``job_lines`` (as the stack builds
    ``JobLifecycle``), ``chain`` (each event through structlog's chain), ``none`` (the hooks with
    events that write nothing: what the hooks cost besides their two lines)."""
    lifecycle, broker = _configure(stream, path != "chain")
    if path == "none":
        lifecycle.write_line = lambda logger_name, event, fields: True
    _per_job_us(lifecycle, broker, 1000)  # warm the caches, as a running worker has them
    figures = [_per_job_us(lifecycle, broker, count) for _ in range(runs)]
    structlog.reset_defaults()
    return statistics.median(figures), figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    for stream in ("memory", "batched"):
        hooks, _ = lifecycle_cost(stream, "none", args.count, args.runs)
        print(f"{stream:8s} hooks without their lines {hooks:6.1f} µs/job")
        for path in ("chain", "job_lines"):
            median, figures = lifecycle_cost(stream, path, args.count, args.runs)
            shown = ", ".join(f"{f:.1f}" for f in figures)
            per_event = (median - hooks) / 2
            print(f"{stream:8s} {path:9s} {median:6.1f} µs/job, {per_event:5.1f} µs/event  runs: {shown}")


if __name__ == "__main__":
    main()
