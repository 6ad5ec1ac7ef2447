"""``python -m demo.orphan_guard PARENT_PID COMMAND [ARG ...]``: run COMMAND, which gets SIGTERM
when the process PARENT_PID (the demo) dies, however it dies.

The demo's children (the worker, the scheduler) run in sessions of their own, so Ctrl-C reaches
only the demo, which stops them itself. A demo killed with SIGKILL (the OOM killer, ``kill -9``)
stops nothing: its worker went on consuming the demo's queues and its scheduler on holding its
lease, for ever. Linux's parent-death signal (``prctl(PR_SET_PDEATHSIG)``), kept across
``exec``, makes the kernel send it SIGTERM instead, which the worker and the scheduler handle as
a clean stop (``dramatiq`` forwards it to its worker processes).

It is set here, in a process of its own between the demo and COMMAND, not in a ``preexec_fn``:
the demo has threads (its mail server, the partner API), and code run between ``fork`` and
``exec`` in a process with threads may deadlock.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

__all__ = ["PR_SET_PDEATHSIG", "guarded", "main"]

#: ``<linux/prctl.h>``: the signal this process gets when its parent dies.
PR_SET_PDEATHSIG = 1

#: The exit code when the parent is already gone: as if the signal had come (128 + SIGTERM).
EXIT_PARENT_GONE = 128 + signal.SIGTERM

USAGE = "usage: python -m demo.orphan_guard PARENT_PID COMMAND [ARG ...]\n"


def guarded(command: list[str]) -> list[str]:
    """``command`` run through this guard, for a child of the calling process (Linux only: other
    systems have no parent-death signal, and get ``command`` as it is)."""
    if not sys.platform.startswith("linux"):
        return command
    return [sys.executable, "-m", "demo.orphan_guard", str(os.getpid()), *command]


def _set_parent_death_signal() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"prctl(PR_SET_PDEATHSIG): {os.strerror(error)}")


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not argv[0].isdigit():
        sys.stderr.write(USAGE)
        return 2
    parent, command = int(argv[0]), argv[1:]
    _set_parent_death_signal()  # an error stops here: never run COMMAND unguarded
    # The parent may have died before the signal was set: it will never come. Then the process
    # has been handed to another (init, a subreaper), and COMMAND must not start.
    if os.getppid() != parent:
        return EXIT_PARENT_GONE
    os.execvp(command[0], command)  # the signal setting survives exec (not for set-user-ID files)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
