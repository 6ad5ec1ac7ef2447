"""A free port for a server the bench or the tests start, outside the range of outgoing connections.

A port the kernel picked for a listener (``bind(("127.0.0.1", 0))``) and released comes from the
same range it hands to outgoing connections: any client socket opened before the server binds
it (a worker's connection to RabbitMQ, a probe of another endpoint) can take it as its own end,
and the server's bind then fails with "address in use". Seen: a test's dashboard, and a bench row
whose ``/metrics`` endpoint never answered (its port chosen minutes before the row ran).
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["free_port"]


def _ephemeral_ports() -> range:
    """The ports the kernel hands to outgoing connections."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return range(int(low), int(high) + 1)
    except (OSError, ValueError):
        return range(32768, 61000)  # Linux's default


def free_port() -> int:
    """A TCP port on loopback that nothing holds right now, chosen outside the ephemeral range."""
    ephemeral = _ephemeral_ports()
    low, high = (10_000, ephemeral.start - 1) if ephemeral.start > 11_000 else (ephemeral.stop, 65_535)
    for _ in range(200):
        port = random.randint(low, high)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port found in {low}-{high}")
