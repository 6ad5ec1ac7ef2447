"""Review 5 (a new user following docs/production.md): "Give CPU-heavy queues their own worker
(``jobctl worker --queues=media``, with the ``QUEUE_PREFIX`` when set)". Under a prefix, the same
command with the plain name, as every other ``jobctl`` option takes a queue (``health --queue``,
``dlq --queue``: the prefix is added), starts a worker that boots, says it is ready, and consumes
nothing, for good and without a word: the queue's jobs wait while the operator believes a worker
serves them. Either the prefix is added (``media`` is this environment's ``<prefix>media``), or
the worker refuses to start naming the queue none of its actors has (one line, exit code 2)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from tests.jobctl_run import jobctl
from tests.queues import Queues
from tests.support import BIN, ROOT

_HEALTH = "health"  # the check_health actor's queue (actors/health.py), a queue of the project


def _consumed_or_refused(worker: subprocess.Popen[str], queues: Queues, queue: str, timeout: float) -> bool:
    """True once ``queue`` has a consumer or the worker exited; False after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if worker.poll() is not None:
            return True
        declared = queues.declared(queue)
        if declared is not None and declared[1] > 0:
            return True
        time.sleep(0.25)
    return False


def test_a_worker_given_a_plain_queue_name_consumes_it_or_refuses(prefix: str, queues: Queues) -> None:
    env = {
        **os.environ,
        "QUEUE_PREFIX": prefix,
        "WORKER_PROCESSES": "1",
        "WORKER_THREADS": "1",
        "PROMETHEUS_PORT": "0",
    }
    worker = subprocess.Popen(
        [str(BIN / "jobctl"), "worker", "--queues", _HEALTH],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        settled = _consumed_or_refused(worker, queues, f"{prefix}{_HEALTH}", timeout=25)
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
        output, _ = worker.communicate(timeout=60)
    assert settled, f"a worker ran 25 s without consuming {prefix}{_HEALTH}:\n{output}"
    if worker.returncode not in (0, -signal.SIGTERM):  # it refused: one line naming the queue
        last = output.strip().splitlines()[-1]
        assert worker.returncode == 2 and _HEALTH in last, output


def test_a_worker_given_a_queue_no_actor_declares_refuses_naming_it(prefix: str) -> None:
    """Neither an actor's queue nor one RabbitMQ has: one line naming it, exit code 2."""
    run = jobctl(prefix, "worker", "--queues", "emails", "no-such-queue", check=False)
    assert run.returncode == 2, run.stdout + run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith("jobctl: --queues 'no-such-queue'") and f"{prefix}no-such-queue" in line, line
