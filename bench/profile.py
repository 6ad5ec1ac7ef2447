"""Where one cost-table row's worker time goes: py-spy samples of the whole worker group.

``python -m bench --profile ROW`` runs one row of the cost table (``bench.costs``; ROW is the start
of its label, e.g. ``"defaults + key"``) on a queue deep enough to outlast the profile, and records
the worker group with ``py-spy record --subprocesses`` for ``--profile-seconds`` once it has booted.
With ``--profile-gil`` only the samples of the thread holding the GIL count: a worker process on
this machine is bound by its GIL, so those shares are what a change can win. The raw samples
(py-spy's collapsed stacks, for a flame graph) are kept under ``var/``; the summary prints each
thread's share, then the functions with the largest shares, the calls they make included
(inclusive) and on their own (self). The rate of a profiled run is not a figure: py-spy slows it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dramatiq.brokers.rabbitmq import RabbitmqBroker

from bench.costs import bare_brokers, rows, run_row
from bench.throughput import ROOT, Run

__all__ = ["Profile", "profile_row", "py_spy_watch", "summarize"]

#: ``function (path:line)`` of one py-spy frame; the line is dropped to add a function's lines up.
_FRAME = re.compile(r"^(?P<function>.*) \((?P<path>[^()]*?)(?::\d+)?\)$")
#: A frame that names the thread a sample was taken on (the first match from the stack's root).
_THREAD_ROOTS = ("WorkerThread.run", "ConsumerThread.run", "Thread.run", "BaseProcess.run")


@dataclass
class Profile:
    """Samples of a profile by thread (its root function), and by function inclusive and self."""

    samples: int = 0
    threads: Counter[str] = field(default_factory=Counter)
    inclusive: Counter[str] = field(default_factory=Counter)
    own: Counter[str] = field(default_factory=Counter)

    def share(self, count: int) -> str:
        return f"{count / self.samples:6.1%}" if self.samples else "     -"

    def lines(self, top: int = 25, only: str = r"^(jobsystem|middleware|dramatiq|pika|redis)/") -> list[str]:
        """The summary: threads, then the ``top`` functions inclusive whose path matches ``only``
        (the project's, Dramatiq's and the clients'), then the ``top`` functions by self samples."""
        out = [f"  {self.samples:,} samples; by thread"]
        out += [f"    {self.share(n)}  {name}" for name, n in self.threads.most_common()]
        out.append("  inclusive (the calls made included)")
        kept = [(name, n) for name, n in self.inclusive.most_common() if re.search(only, _path_of(name))]
        out += [f"    {self.share(n)}  {name}" for name, n in kept[:top]]
        out.append("  self")
        out += [f"    {self.share(n)}  {name}" for name, n in self.own.most_common(top)]
        return out


def _path_of(name: str) -> str:
    match = _FRAME.match(name)
    return match["path"] if match else ""


def _frame_name(frame: str) -> str:
    """``function (path)``: the frame without its line number, its path from the package root."""
    match = _FRAME.match(frame)
    if match is None:
        return frame
    path = match["path"]
    for marker in ("site-packages/", f"{ROOT}/"):
        path = path.split(marker, 1)[-1]
    return f"{match['function']} ({path})"


def summarize(collapsed: str) -> Profile:
    """A :class:`Profile` of py-spy's raw output: one ``frame;frame;... COUNT`` line per stack, root
    first; ``process N:"..."`` frames (``--subprocesses``) and ``thread (...)`` frames are skipped."""
    profile = Profile()
    for line in collapsed.splitlines():
        stack, _, count_text = line.rstrip().rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [
            _frame_name(frame) for frame in stack.split(";") if not frame.startswith(("process ", "thread ("))
        ]
        if not frames:
            continue
        profile.samples += count
        thread = next((f for f in frames if f.split(" (", 1)[0] in _THREAD_ROOTS), "other threads")
        profile.threads[thread.split(" (", 1)[0]] += count
        for name in dict.fromkeys(frames):  # a recursive function counts once per sample
            profile.inclusive[name] += count
        profile.own[frames[-1]] += count
    return profile


def py_spy_watch(out: Path, seconds: float, *, gil: bool, rate: int = 250) -> Callable[[int], None]:
    """A ``watch`` for :func:`bench.throughput.throughput`: records the worker group whose parent
    is the pid it is given into ``out`` (raw collapsed stacks). Raises when py-spy is missing or
    fails (it needs to ptrace the workers: root, or ``kernel.yama.ptrace_scope`` 0)."""
    beside = Path(sys.executable).with_name("py-spy")  # the venv's, when it is not on PATH
    py_spy = str(beside) if beside.exists() else shutil.which("py-spy")
    if py_spy is None:
        raise RuntimeError("py-spy is not installed: pip install -e '.[dev]'")

    def watch(pid: int) -> None:
        command = [py_spy, "record", "--subprocesses", "--format", "raw", "--rate", str(rate)]
        command += ["--duration", str(int(seconds)), "--output", str(out), "--pid", str(pid)]
        if gil:
            command.append("--gil")
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0 or not out.exists():
            raise RuntimeError(f"py-spy failed ({done.returncode}): {done.stderr.strip()[-500:]}")

    return watch


def profile_row(label: str, run: Run, seconds: float, *, gil: bool) -> tuple[Path, Profile]:
    """Profile the cost-table row whose label starts with ``label`` (see the module's docstring);
    the raw samples' path and their summary. Runs inside the bench's scratch environment."""
    from jobsystem.system import get_system

    table = rows()
    chosen = [row for row in table if row.label.startswith(label)]
    if len(chosen) != 1:
        labels = "; ".join(row.label for row in table)
        raise SystemExit(f"--profile {label!r} names {len(chosen)} rows; one of: {labels}")
    row = chosen[0]
    out = ROOT / "var" / f"profile-{re.sub(r'[^a-z0-9]+', '-', row.label.lower()).strip('-')}.txt"
    out.parent.mkdir(exist_ok=True)
    bare = bare_brokers(get_system().settings.rabbitmq_url)
    senders: dict[tuple[str, str], RabbitmqBroker] = {}
    try:
        run_row(run, row, bare, senders, py_spy_watch(out, seconds, gil=gil))
    finally:
        for broker in [*bare.values(), *senders.values()]:
            broker.close()
    return out, summarize(out.read_text())
