"""Review (faults, area 1): dead letters are replayed without loss, whatever the letter or the fault.

Without RabbitMQ, as ``test_dlq_replay``: a stand-in reader holds the dead letters and a stand-in
bulk send records what is published.
"""

from __future__ import annotations

from typing import Any

import pika.exceptions
import pytest
from dramatiq import Message

from jobsystem.ops import dead_letters as ops
from tests.unit.test_dlq_replay import NO_INDEX, _dead, _Queues

RECORD = {"x-dl-reason": "retries_exhausted", "x-dl-queue": "p-work"}


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> Any:
    def make(letters: list[Message[Any]]) -> _Queues:
        dead = [_dead("p-work.DLQ", m.encode(), RECORD, m.message_id) for m in letters]
        queues = _Queues({"p-work.DLQ": dead})
        monkeypatch.setattr(ops, "Reader", queues.reader)
        monkeypatch.setattr(ops, "send_bulk", queues.send_bulk)
        return queues

    return make


def test_a_dead_letter_whose_replays_option_is_null_does_not_stop_the_replay(made: Any) -> None:
    """``"replays": null`` passes the shape check (null options are allowed), so the worker ran the
    message and dead-lettered it with the project's record. ``jobctl dlq retry --all`` (and the
    dashboard's retry) then raises TypeError at this letter: it and every letter after it in the
    queue can never be replayed by a retry of all of them."""
    poison: Message[Any] = Message("p-work", "job", (), {}, {"replays": None})
    good: Message[Any] = Message("p-work", "job", (), {}, {})
    queues = made([poison, good])
    outcome = ops.replay(NO_INDEX, ["p-work.DLQ"], ops.Filters())  # type: ignore[arg-type]
    assert good.message_id in [m.message_id for m in queues.published]
    assert outcome.done + outcome.skipped == 2
    # Read as never replayed: this is its first replay, as the status records will order it.
    replayed = {m.message_id: m.options["replays"] for m in queues.published}
    assert replayed == {poison.message_id: 1, good.message_id: 1}


@pytest.mark.xfail(
    strict=True,
    raises=pika.exceptions.ChannelWrongStateError,
    reason="jobsystem/ops/dead_letters.py:_publish_then_ack: the reader's connection lost between the "
    "confirmed publish and the ack escapes as an exception, with no outcome saying what was published",
)
def test_a_connection_lost_between_publish_and_removal_is_reported_not_raised(
    made: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The replays were published and confirmed; the reader's connection (idle through a long
    confirmed publish: heartbeats missed) is gone, so its ack raises. The module promises that a
    connection lost before the removal is confirmed "stops the operation, says so (unconfirmed)":
    instead jobctl ends with a traceback, and the operator, told nothing was retried, runs the
    retry again and publishes every one of them a second time."""
    message: Message[Any] = Message("p-work", "job", (), {}, {})
    queues = made([message])

    def lost(tag: int) -> None:
        raise pika.exceptions.ChannelWrongStateError("Channel is closed.")

    reader = queues.reader

    def losing_reader(broker: Any) -> Any:
        made_reader = reader(broker)
        made_reader.ack = lost
        made_reader.settle = lambda name: False
        return made_reader

    monkeypatch.setattr(ops, "Reader", losing_reader)
    outcome = ops.replay(NO_INDEX, ["p-work.DLQ"], ops.Filters())  # type: ignore[arg-type]
    assert [m.message_id for m in queues.published] == [message.message_id]
    assert outcome.unconfirmed == 1 and outcome.notes
