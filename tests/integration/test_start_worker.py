"""The ``start_worker`` fixture returns a worker once its own consumers are on every queue it
consumes, also right after a worker was killed, whose consumers RabbitMQ may still count."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pika

from tests.queues import Queues
from tests.support import wait_for


def test_a_worker_started_after_a_kill_is_returned_once_it_consumes(
    start_worker: Any, queues: Queues, tmp_path: Path, monkeypatch: Any
) -> None:
    """RabbitMQ drops a killed worker's consumers a moment after its connections closed. Until it
    does they count, and the wait for the new worker's consumers, counting one per running worker
    process, was met by them and ended before the new worker subscribed.

    The killed worker's consumer RabbitMQ still counts is played by a consumer of the test's own on
    one of the queues, dropped once the fixture has looked at the queue while the next worker is not
    started yet (its log file not opened). It is exclusive, which keeps the next worker's consumer
    off the queue while it lasts: a wait it satisfies ends before the next worker consumes there."""
    killed = start_worker()
    killed.kill()
    killed.proc.wait(10)
    queue = queues.consumed()[0]
    wait_for(lambda: queues.declared(queue) == (0, 0), what="the killed worker's consumer gone")
    ghost = pika.BlockingConnection(pika.URLParameters(queues.settings.rabbitmq_url.split(";")[0]))
    channel = ghost.channel()
    tags = [channel.basic_consume(queue, lambda *_: None, exclusive=True)]
    declared = queues.declared
    next_log = tmp_path / "worker-1.log"  # the fixture's name for its second worker's output

    def looked(name: str) -> tuple[int, int] | None:
        counts = declared(name)
        if name == queue and tags and not next_log.exists():
            channel.basic_cancel(tags.pop())
        return counts

    monkeypatch.setattr(queues, "declared", looked)
    try:
        start_worker()
        counts = declared(queue)
        assert counts is not None
        assert counts[1] - len(tags) == 1, "start_worker returned before the new worker consumed the queue"
    finally:
        ghost.close()
