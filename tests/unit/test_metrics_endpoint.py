"""The metrics endpoint waits for its port while it is in use, and gives up at once on other errors."""

from __future__ import annotations

import errno
import socket
from http.server import BaseHTTPRequestHandler

import pytest

from bench.ports import free_port
from jobsystem.observability.metrics import bind_endpoint


def test_a_port_in_use_is_tried_again_with_a_growing_pause_until_it_is_free():
    port = free_port()  # outside the ephemeral range: no client connection takes it once freed
    holder = socket.socket()
    holder.bind(("127.0.0.1", port))
    holder.listen()
    pauses: list[float] = []

    def pause(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 7:
            holder.close()  # the port is freed during the seventh pause

    server = bind_endpoint("127.0.0.1", port, BaseHTTPRequestHandler, max_retry_s=30.0, sleep=pause)
    try:
        assert server.server_address == ("127.0.0.1", port)
        assert pauses == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    finally:
        server.server_close()


def test_an_address_not_of_this_host_is_raised_without_a_pause():
    pauses: list[float] = []
    with pytest.raises(OSError) as raised:
        bind_endpoint("192.0.2.1", 0, BaseHTTPRequestHandler, sleep=pauses.append)  # TEST-NET-1
    assert raised.value.errno == errno.EADDRNOTAVAIL
    assert pauses == []
