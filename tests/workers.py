"""The project's commands in subprocesses: a real ``dramatiq`` worker and the JSON events it logs,
and the processes' tree from ``/proc``."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tests.support import BIN, ROOT, wait_for

__all__ = [
    "FINAL_EVENTS",
    "WORKER_MODULES",
    "Process",
    "Worker",
    "final_events",
    "json_lines",
    "process_tree",
    "running",
    "wait_for_final_events",
]

#: Worker log events that end one delivery of a message for good: it ran, it was dead-lettered,
#: it was cancelled, or it was a duplicate of a completed idempotency key and dropped.
#: ``job_skipped`` alone is not one: a message deferred (key held, store down, rate limit) is
#: skipped too, and comes back.
FINAL_EVENTS = ("job_succeeded", "job_dead_lettered", "job_cancelled", "duplicate_skipped")


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """A process's state letter and parent pid from ``/proc`` (Linux); None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    state, ppid = stat[stat.rindex(")") + 2 :].split()[:2]  # the name in parentheses may hold spaces
    return state, int(ppid)


def running(pid: int) -> bool:
    """Whether ``pid`` still runs: gone, or a zombie (exited, not yet reaped by its new parent), is not."""
    stat = _proc_stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def process_tree(pid: int) -> list[int]:
    """``pid``'s descendants, children first, from ``/proc`` (Linux)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _proc_stat(int(entry.name))) is not None:
            parents[int(entry.name)] = stat[1]
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


class Process:
    """A command of the project's environment in a subprocess (a session of its own, run from the
    checkout), its stdout and stderr captured to ``log_path``."""

    def __init__(self, argv: list[str], log_path: Path, env: dict[str, str]) -> None:
        self.log_path = log_path
        self.log = log_path.open("ab")
        self.proc = subprocess.Popen(
            [str(BIN / argv[0]), *argv[1:]],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")


#: The modules a test worker's ``dramatiq`` imports: the project's actors, then the tests' own.
WORKER_MODULES = ("actors", "tests.workload")


class Worker(Process):
    """``dramatiq actors tests.workload`` in a subprocess, with its output captured to a file."""

    def __init__(self, log_path: Path, env: dict[str, str], processes: int = 1, threads: int = 4) -> None:
        self.processes = processes
        argv = ["dramatiq", *WORKER_MODULES, "-p", str(processes), "-t", str(threads)]
        super().__init__(argv, log_path, env)

    def check_running(self) -> None:
        """Fail the test, showing the worker's output, if the worker exited."""
        if self.proc.poll() is not None:
            raise AssertionError(f"worker exited with {self.proc.returncode}:\n{self.output()}")

    def events(self, *names: str, **fields: Any) -> list[dict[str, Any]]:
        """The worker's JSON log lines (``LOG_FORMAT=json``), only those of the events ``names``
        when given, and whose fields have the values given (``message_id=...``)."""
        return [
            line
            for line in json_lines(self.output())
            if (not names or line.get("event") in names) and all(line.get(k) == v for k, v in fields.items())
        ]

    def wait_ready(self, timeout: float = 30.0) -> None:
        def ready() -> bool:
            self.check_running()
            return self.output().count("Worker process is ready for action") >= self.processes

        wait_for(ready, timeout, what="worker start")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Signal the main process only (it forwards to its children) and wait for it to exit."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        finally:
            self.log.close()

    def kill(self) -> None:
        """SIGKILL the whole process group, as a crashed host would."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(os.getpgid(self.proc.pid), signal.SIGKILL)


def json_lines(text: str) -> list[dict[str, Any]]:
    """The JSON objects of ``text``, one a line; other lines (Dramatiq's parent process, a line
    still being written) are left out."""
    lines = []
    for line in text.splitlines():
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict):
                    lines.append(record)
    return lines


def final_events(workers: Iterable[Worker], message_ids: Iterable[str]) -> dict[str, list[str]]:
    """For each of ``message_ids``, the :data:`FINAL_EVENTS` the workers logged for it, in order."""
    found: dict[str, list[str]] = {message_id: [] for message_id in message_ids}
    for worker in workers:
        for line in worker.events(*FINAL_EVENTS):
            if line.get("message_id") in found:
                found[line["message_id"]].append(line["event"])
    return found


def wait_for_final_events(
    workers: Iterable[Worker], deliveries: Mapping[str, int], timeout: float = 60.0
) -> dict[str, Counter[str]]:
    """Wait until each message id in ``deliveries`` has that many final events (one per delivered
    copy: the run, the skipped duplicates, the dead letter) in the workers' logs; returns them
    counted by event name, for the test to assert the exact outcome of every copy.

    Only a delivery that ended has a final event; a copy still prefetched, deferred or held by a
    worker has none yet: unlike a queue's depth, this cannot be reached while work is pending.
    """
    workers = list(workers)

    def done() -> dict[str, Counter[str]] | None:
        found = final_events(workers, deliveries)
        if all(len(found[m]) >= n for m, n in deliveries.items()):
            return {m: Counter(events) for m, events in found.items()}
        return None

    result: dict[str, Counter[str]] = wait_for(
        done, timeout, interval=0.1, what=f"the final events of {dict(deliveries)}"
    )
    return result
