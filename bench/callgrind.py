"""A Redis server of its own under callgrind, to count the instructions a store call costs Redis.

CPU time is a poor measure of a script's cost on a small shared machine: the same loop's CPU
time scatters by +-20% between runs, and Redis's CPU per job in the cost table by +-30%. The
instructions Redis executes for the same call on the same data (``valgrind --tool=callgrind``
counts them) stay within about 1.5% from run to run however loaded the machine is (Redis's own
event loop runs around the call as the load allows), so a change to a Lua script shows its
price. The server runs ~50x slower under valgrind: calls to it need a long timeout, and what is
counted should be a few thousand jobs.

valgrind and ``redis-server`` must be installed (both are on the project's machines, where CI runs
this module's test; elsewhere the test is skipped). The server keeps nothing on disk and is
stopped, its files removed, on exit.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import redis

from bench.ports import free_port

__all__ = ["CallgrindRedis", "callgrind_redis"]


class CallgrindRedis:
    """A running ``redis-server`` under callgrind (see :func:`callgrind_redis`).

    Parameters:
      pid: the valgrind process running the server.
      port: where it listens (127.0.0.1).
      out: the directory callgrind writes its dumps into.
    """

    def __init__(self, pid: int, port: int, out: Path) -> None:
        self.pid = pid
        self.port = port
        self.out = out
        self.url = f"redis://127.0.0.1:{port}/0"

    def instructions(self, call: Callable[[], object]) -> int:
        """The instructions Redis executed while ``call`` ran (every client's: run nothing else
        against this server meanwhile)."""
        self._control("-z")  # zero the counters
        before = set(self.out.iterdir())
        call()
        self._control("-d")  # dump what was counted since
        dumps = sorted(set(self.out.iterdir()) - before, key=lambda p: p.stat().st_mtime)
        if not dumps:
            raise RuntimeError("callgrind wrote no dump")
        for line in dumps[-1].read_text().splitlines():
            if line.startswith(("totals:", "summary:")):
                return int(line.split()[1])
        raise RuntimeError(f"no totals in {dumps[-1]}")

    def _control(self, option: str) -> None:
        subprocess.run(["callgrind_control", option, str(self.pid)], check=True, capture_output=True)


def _start(out: Path, port: int, boot_timeout: float) -> subprocess.Popen[bytes] | None:
    """``redis-server`` under callgrind on ``port``, once it answers; None when it exited first
    (the port was taken after it was chosen)."""
    command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}/callgrind.%p"]
    command += ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"]
    command += ["--busy-reply-threshold", "60000"]  # a script runs ~50x longer under valgrind
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port, socket_timeout=5)
    deadline = time.monotonic() + boot_timeout
    try:
        while True:
            try:
                client.ping()
                return server
            except redis.ConnectionError:
                if server.poll() is not None:
                    return None
                if time.monotonic() > deadline:
                    _stop(server)
                    raise RuntimeError("redis-server under callgrind did not start") from None
                time.sleep(0.2)
    finally:
        client.close()


def _stop(server: subprocess.Popen[bytes]) -> None:
    server.terminate()
    try:
        server.wait(30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait(30)


@contextlib.contextmanager
def callgrind_redis(boot_timeout: float = 60.0, attempts: int = 5) -> Iterator[CallgrindRedis]:
    """Start ``redis-server`` under callgrind on a free port (another one if that was taken in the
    seconds valgrind takes to start); stop it and remove its files on exit."""
    for tool in ("valgrind", "callgrind_control", "redis-server"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"{tool} is not installed (apt-get install -y valgrind redis-server)")
    out = Path(tempfile.mkdtemp(prefix="bench-callgrind-"))
    try:
        for _ in range(attempts):
            port = free_port()
            server = _start(out, port, boot_timeout)
            if server is not None:
                break
        else:
            raise RuntimeError(f"redis-server under callgrind exited at start {attempts} times")
        try:
            yield CallgrindRedis(server.pid, port, out)
        finally:
            _stop(server)
    finally:
        shutil.rmtree(out, ignore_errors=True)
