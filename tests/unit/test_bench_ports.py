"""A free port is chosen outside the range the kernel gives outgoing connections, and is free."""

from __future__ import annotations

import socket

from bench.ports import _ephemeral_ports, free_port


def test_a_free_port_is_outside_the_ephemeral_range_and_can_be_bound():
    ephemeral = _ephemeral_ports()
    for _ in range(20):
        port = free_port()
        assert port not in ephemeral
        with socket.socket() as server:
            server.bind(("127.0.0.1", port))
