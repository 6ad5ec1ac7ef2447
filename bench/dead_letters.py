"""Dead-letter figures for ``make bench``: list and replay rates, and the peak memory of ``list``."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pika
from dramatiq import Message

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


#: Runs ``jobctl dlq list --json --queue Q`` in this interpreter, then prints its own peak RSS (KiB)
#: on stderr: the peak of that one process, not of every child the bench has waited for.
_LIST_AND_REPORT_PEAK = """
import resource, sys
sys.argv = ["jobctl", "dlq", "list", "--json", "--queue", sys.argv[1]]
from jobctl.main import main
try:
    main()
finally:
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
"""


def fill(count: int) -> tuple[str, Any]:
    """A fresh queue whose .DLQ holds ``count`` dead letters with full records."""
    from jobsystem.rabbitmq.broker import dead_letter_queue
    from jobsystem.system import get_system

    broker = get_system().broker
    queue = f"bench-dl-{uuid.uuid4().hex[:8]}"
    broker.declare_queue(queue, ensure=True)
    channel = broker.connection.channel()
    channel.confirm_delivery()
    headers = {
        "x-dl-reason": "retries_exhausted",
        "x-dl-exception": "ConnectionError",
        "x-dl-error": "dependency is down",
        "x-dl-traceback": "Traceback (most recent call last):\n" + "  File ...\n" * 30,
        "x-dl-attempts": 6,
        "x-dl-queue": queue,
        "x-dl-actor": "noop",
        "x-dl-enqueued-at": "2026-11-29T00:00:00+00:00",
        "x-dl-failed-at": "2026-11-29T00:10:00+00:00",
        "x-dl-environment": broker.environment,  # as its workers stamp them
    }
    for _ in range(count):
        message: Message[Any] = Message(queue_name=queue, actor_name="noop", args=(), kwargs={}, options={})
        properties = pika.BasicProperties(delivery_mode=2, message_id=message.message_id, headers=headers)
        channel.basic_publish("", dead_letter_queue(queue), message.encode(), properties)
    channel.close()
    return queue, broker


def dead_letter_figures(count: int) -> list[tuple[str, str]]:
    """(label, figure) rows: list rate and peak memory (a real ``jobctl dlq list`` process), replay rate."""
    from jobsystem.ops import dead_letters as ops
    from jobsystem.rabbitmq.broker import dead_letter_queue

    queue, broker = fill(count)
    rows: list[tuple[str, str]] = []
    try:
        started = time.perf_counter()
        listed = subprocess.run(
            [sys.executable, "-c", _LIST_AND_REPORT_PEAK, queue],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        elapsed = time.perf_counter() - started
        lines = len(listed.stdout.splitlines())
        peak_mib = int(listed.stderr.strip().splitlines()[-1]) / 1024
        rows.append((f"jobctl dlq list, {lines:,} dead letters", f"{lines / elapsed:,.0f} /s"))
        rows.append(("jobctl dlq list, peak memory (max RSS of the process)", f"{peak_mib:,.0f} MiB"))
        started = time.perf_counter()
        outcome = ops.replay(broker, [dead_letter_queue(queue)], ops.Filters())
        elapsed = time.perf_counter() - started
        rows.append(
            (f"replay (confirmed publish, then ack), {outcome.done:,}", f"{outcome.done / elapsed:,.0f} /s")
        )
    finally:
        for name in (queue, f"{queue}.DQ", dead_letter_queue(queue)):
            broker.channel.queue_delete(name)
    return rows
