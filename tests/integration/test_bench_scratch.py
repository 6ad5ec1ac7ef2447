"""The bench's scratch environment deletes its own queues and exchanges, and nothing else."""

from __future__ import annotations

import os

import pika.exceptions
import pytest

from bench import scratch


def test_only_a_bench_environments_queues_are_deleted():
    from jobsystem.settings import load_settings
    from jobsystem.system import build_system

    with pytest.raises(ValueError, match="not a bench's prefix"):
        settings = load_settings({**os.environ, "QUEUE_PREFIX": "prod."})
        scratch.delete_topology(build_system(settings).broker, settings)
    prefix = scratch.new_prefix()
    settings = load_settings({**os.environ, "QUEUE_PREFIX": prefix})
    broker = build_system(settings).broker
    neighbour = f"{prefix[:-1]}-neighbour"  # shares the letters, not the prefix
    broker.declare_queue(f"{prefix}work", ensure=True)  # with its .DQ, .DLQ and the delay cascade
    broker.channel.queue_declare(neighbour, durable=True)
    try:
        deleted = scratch.delete_topology(broker, settings)
        assert {f"{prefix}work", f"{prefix}work.DQ", f"{prefix}work.DLQ", f"{prefix}delay.L0"} <= set(deleted)
        assert all(name.startswith(prefix) for name in deleted)
        broker.channel.queue_declare(neighbour, passive=True)  # still there
        with pytest.raises(pika.exceptions.ChannelClosedByBroker):
            broker.channel.exchange_declare(f"{prefix}delay.deliver", passive=True)
    finally:
        del broker.channel  # closed by the refused passive declare: open a fresh one
        broker.channel.queue_delete(neighbour)
        broker.close()
