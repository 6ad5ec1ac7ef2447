"""Bulk send: confirmed means in the queue; a nack names the messages that did not make it."""

from __future__ import annotations

import actors  # noqa: F401 - the global broker, as an application that sends has it
from jobsystem.rabbitmq.bulk import send_bulk


def test_empty_bulk_send_publishes_nothing():
    assert send_bulk([]) == []
