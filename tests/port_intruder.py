"""``python -m tests.port_intruder dashboard ... --port PORT``: ``jobctl dashboard`` with another
socket of this process trying to take PORT (bind and listen, SO_REUSEADDR, as uvicorn and most
servers bind) once the dashboard has claimed it and before uvicorn serves: when the dashboard's
sampler starts. It prints ``intruder: refused`` or ``intruder: took the port`` (and keeps it).

A dashboard that only checked the port and let it go, then had uvicorn bind it again, lost it
there to any process: uvicorn's own bind error and exit code 3 instead of a served dashboard."""

from __future__ import annotations

import socket
import sys

from dashboard import queues
from jobctl.main import main

__all__ = ["intrude"]

#: The intruder's socket once it took the port: kept open for as long as the dashboard runs.
_HELD: list[socket.socket] = []


def intrude(port: int) -> str:
    """Try to take ``port`` on 127.0.0.1: ``refused``, or ``took the port`` (kept)."""
    intruder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    intruder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        intruder.bind(("127.0.0.1", port))
        intruder.listen()
    except OSError:
        intruder.close()
        return "refused"
    _HELD.append(intruder)
    return "took the port"


def run(args: list[str]) -> None:
    """``jobctl ARGS``, the intruder trying its luck as the dashboard's sampler starts."""
    port = int(args[args.index("--port") + 1])
    start = queues.HealthSampler.start

    def intrude_then_start(sampler: queues.HealthSampler, wait: float = 10.0) -> None:
        print(f"intruder: {intrude(port)}", flush=True)
        start(sampler, wait)

    queues.HealthSampler.start = intrude_then_start  # type: ignore[method-assign,assignment]
    main(args, prog_name="jobctl")


if __name__ == "__main__":
    run(sys.argv[1:])
