"""Stand-ins for the dead-letter replay tests without RabbitMQ: the reader holds the letters,
the bulk send records what is published (see ``tests/unit/test_dlq_replay.py``)."""

from __future__ import annotations

from typing import Any

import pytest
from dramatiq import Message

from jobsystem.ops import dead_letters as ops
from tests.unit.test_dlq_replay import _dead, _Queues

__all__ = ["RECORD", "stand_in_queues"]

RECORD = {"x-dl-reason": "retries_exhausted", "x-dl-queue": "p-work"}


def stand_in_queues(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``make(letters)``: the stand-in queue ``p-work.DLQ`` holding ``letters`` as dead letters,
    read and replayed through by ``jobsystem.ops.dead_letters``."""

    def make(letters: list[Message[Any]]) -> _Queues:
        dead = [_dead("p-work.DLQ", m.encode(), RECORD, m.message_id) for m in letters]
        queues = _Queues({"p-work.DLQ": dead})
        monkeypatch.setattr(ops, "Reader", queues.reader)
        monkeypatch.setattr(ops, "send_bulk", queues.send_bulk)
        return queues

    return make
