"""Stand-ins for the dead-letter replay tests without RabbitMQ: the reader holds the letters,
the bulk send records what is published (see ``tests/unit/test_dlq_replay.py``)."""

from __future__ import annotations

from typing import Any

import pika.exceptions
import pytest
from dramatiq import Message

from jobsystem.ops import dead_letters as ops
from tests.unit.test_dlq_replay import NO_INDEX, StandInContext, _dead, _Queues

__all__ = [
    "LOST",
    "RECORD",
    "TWO_QUEUES",
    "StandInQueues",
    "letters_of",
    "reader_lost_at_read",
    "stand_in_queues",
]

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


LOST = "Stream connection lost: ConnectionResetError(104, 'Connection reset by peer') 10.0.0.5:5672"


def reader_lost_at_read(queues: _Queues, reads: int) -> Any:
    """The stand-in reader whose connection is found lost when letter number ``reads + 1`` (over
    every queue it streams) is asked for: ``basic_get`` raises, as pika's does."""
    done = [0]

    def reader(broker: Any) -> Any:
        made_reader = queues.reader(broker)
        stream = made_reader.stream

        def lost_stream(name: str) -> Any:
            for item in stream(name):
                if done[0] == reads:
                    raise pika.exceptions.StreamLostError(LOST)
                done[0] += 1
                yield item

        made_reader.stream = lost_stream
        return made_reader

    return reader


def letters_of(queue: str, count: int, environment: str = "p-") -> list[Any]:
    """``count`` dead letters of ``queue`` as the worker of ``environment`` records them."""
    record = {"x-dl-reason": "retries_exhausted", "x-dl-queue": queue.removesuffix(".DLQ")}
    record["x-dl-environment"] = environment
    messages: list[Message[Any]] = [Message("p-work", "job", (), {}, {}) for _ in range(count)]
    return [_dead(queue, m.encode(), record, m.message_id) for m in messages]


TWO_QUEUES = ["p-work.DLQ", "p-more.DLQ"]


class StandInQueues(StandInContext):
    """``jobctl dlq``'s context over the stand-in queues of :data:`TWO_QUEUES`, matching the ids
    a command is given."""

    def __init__(self, ids: tuple[str, ...], selected: Any, *, reading: bool = False) -> None:
        super().__init__(ids, selected)
        self.broker, self.queues = NO_INDEX, TWO_QUEUES
        self.filters = ops.Filters(message_ids=frozenset(ids))
