"""Purge and retry take dead letters out of the index only once RabbitMQ is known to have processed
their acks (real RabbitMQ and Redis): an ack has no reply, so acks lost with the connection leave
the letters in their queue, where the index must still list them."""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import quote

import pytest
import requests
from dramatiq import Message

from jobsystem.ops import dead_letters as ops
from jobsystem.ops.dead_letter_reader import Reader
from jobsystem.runtime.message_shape import OPTION_SHAPES, decode
from tests.jobctl_run import jobctl
from tests.senders import publish_dead_letters
from tests.support import wait_for

COUNT = 5


def _dead_letters(broker: Any, queue: str) -> str:
    """``COUNT`` dead letters of ``queue``, published and indexed as a worker does; their ``.DLQ``."""
    dead_letter_queue = publish_dead_letters(broker, queue, COUNT)
    assert _indexed(broker, queue) == COUNT
    return dead_letter_queue


def _indexed(broker: Any, queue: str) -> int:
    count: int = broker.dead_letter_index.backend.counts().get(queue, 0)
    return count


@pytest.fixture
def acks_lost(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The reader's acks are written but lost with its connection, which closes after the last
    one: RabbitMQ never processed them, and puts the letters back in their queue."""
    lost: list[int] = []

    def ack(reader: Reader, tag: int) -> None:
        lost.append(tag)
        if len(lost) == COUNT:
            reader.connection.close()

    monkeypatch.setattr(Reader, "ack", ack)
    return lost


def test_a_purge_forgets_the_letters_in_the_index_once_rabbitmq_confirmed_the_acks(queues, prefix):
    broker = queues.broker
    dead = _dead_letters(broker, f"{prefix}purged")
    outcome = ops.purge(broker, [dead], ops.Filters())
    assert (outcome.done, outcome.unconfirmed, outcome.notes) == (COUNT, 0, [])
    assert queues.depth(dead) == 0 and _indexed(broker, f"{prefix}purged") == 0


def test_a_purge_whose_acks_are_lost_with_the_connection_keeps_the_letters_indexed(queues, prefix, acks_lost):
    broker = queues.broker
    dead = _dead_letters(broker, f"{prefix}unsure")
    outcome = ops.purge(broker, [dead], ops.Filters())
    assert len(acks_lost) == COUNT
    wait_for(lambda: queues.depth(dead) == COUNT, what="the letters back in their queue")
    assert _indexed(broker, f"{prefix}unsure") == COUNT  # still listed, as they still are
    assert (outcome.done, outcome.unconfirmed, outcome.matched) == (0, COUNT, COUNT)
    assert "not confirmed" in outcome.notes[0]


def test_a_retry_forgets_the_letters_in_the_index_once_rabbitmq_confirmed_the_acks(queues, prefix):
    broker = queues.broker
    queue = f"{prefix}replayed"
    dead = _dead_letters(broker, queue)
    outcome = ops.replay(broker, [dead], ops.Filters())
    assert (outcome.done, outcome.unconfirmed, outcome.notes) == (COUNT, 0, [])
    assert queues.depth(dead) == 0 and _indexed(broker, queue) == 0
    assert queues.depth(queue) == COUNT


def test_a_retry_whose_acks_are_lost_with_the_connection_keeps_the_letters_indexed(queues, prefix, acks_lost):
    """The replays were confirmed (they run); the dead letters are back, and listed: retrying them
    again would publish the same message ids again (only idempotency keys make that harmless), so
    the outcome names them to purge."""
    broker = queues.broker
    queue = f"{prefix}unsure-replay"
    dead = _dead_letters(broker, queue)
    outcome = ops.replay(broker, [dead], ops.Filters())
    wait_for(lambda: queues.depth(dead) == COUNT, what="the letters back in their queue")
    assert _indexed(broker, queue) == COUNT
    assert (outcome.done, outcome.unconfirmed) == (COUNT, COUNT) and queues.depth(queue) == COUNT
    assert "Do not retry them again" in outcome.notes[0] and len(set(outcome.unremoved)) == COUNT


def test_the_purge_a_stopped_retry_names_leaves_a_newer_dead_letter_of_the_same_job(
    queues, prefix, acks_lost
):
    """The letters replayed, their removal not confirmed, are named to purge. Before the operator
    does, each replay fails again: the worker dead-letters it, a newer dead letter of the same
    message id. The purge the retry's note names, run as written, removed those too (by id): the
    jobs' last failures were gone unseen. It removes the letters replayed only."""
    broker = queues.broker
    queue = f"{prefix}failed-again"
    dead = _dead_letters(broker, queue)
    outcome = ops.replay(broker, [dead], ops.Filters())
    wait_for(lambda: queues.depth(dead) == COUNT, what="the letters back in their queue")
    headers = {"x-dl-reason": "retries_exhausted", "x-dl-actor": "record", "x-dl-queue": queue}
    for replay in queues.peek(queue):  # as the worker's consumer dead-letters a failed message
        message_id = json.loads(replay["payload"])["message_id"]
        broker.publish_dead_letter(replay["payload"].encode(), headers, message_id, queue)
    assert broker.dead_letter_index.flush(10)
    (note,) = [n for n in outcome.notes if "purge" in n]
    command = re.search(r"jobctl (dlq purge .*) ID\.\.\.: (.*)$", note)
    assert command is not None, note
    jobctl(prefix, *command[1].split(), *command[2].split())  # as the operator runs it
    left = [json.loads(m["payload"]) for m in queues.peek(dead, count=2 * COUNT)]
    assert sorted((m["message_id"], m["options"]["replays"]) for m in left) == sorted(
        (message_id, 1) for message_id in outcome.unremoved
    )
    assert _indexed(broker, queue) == COUNT


def test_a_retry_whose_reader_connection_is_lost_before_the_acks_reports_them_unremoved(
    queues, prefix, monkeypatch
):
    """The reader's connection is gone when the confirmed replays are to be removed (idle through a
    long publish): pika's ack raises. The replay ends with an outcome, not a traceback: replayed,
    not removed (the letters come back), named to purge."""
    broker = queues.broker
    queue = f"{prefix}lost-reader"
    dead = _dead_letters(broker, queue)
    ack = Reader.ack

    def ack_after_loss(reader: Reader, tag: int) -> None:
        if reader.connection.is_open:
            reader.connection.close()
        ack(reader, tag)

    monkeypatch.setattr(Reader, "ack", ack_after_loss)
    outcome = ops.replay(broker, [dead], ops.Filters())
    wait_for(lambda: queues.depth(dead) == COUNT, what="the letters back in their queue")
    assert _indexed(broker, queue) == COUNT and queues.depth(queue) == COUNT
    assert (outcome.done, outcome.unconfirmed, len(set(outcome.unremoved))) == (COUNT, COUNT, COUNT)


def test_a_purge_whose_dead_letter_queue_is_deleted_after_the_acks_counts_them_removed(
    queues, prefix, monkeypatch
):
    """The passive declare that settles the acks answers 404 when the ``.DLQ`` was deleted
    meanwhile: a reply after the acks all the same, so they were processed. The 404 closed the
    reader's channel: the next queue is read on a new one."""
    broker = queues.broker
    gone, kept = _dead_letters(broker, f"{prefix}deleted"), _dead_letters(broker, f"{prefix}kept")
    acked: list[int] = []
    ack = Reader.ack

    def ack_then_delete(reader: Reader, tag: int) -> None:
        ack(reader, tag)
        acked.append(tag)
        if len(acked) == COUNT:  # the last of the first queue's
            requests.delete(
                queues.api(f"/{quote(gone, safe='')}"), auth=queues.auth, timeout=10
            ).raise_for_status()

    monkeypatch.setattr(Reader, "ack", ack_then_delete)
    outcome = ops.purge(broker, [gone, kept], ops.Filters())
    assert (outcome.done, outcome.unconfirmed, outcome.notes) == (2 * COUNT, 0, [])
    assert queues.declared(gone) is None and queues.depth(kept) == 0
    assert _indexed(broker, f"{prefix}deleted") == 0 and _indexed(broker, f"{prefix}kept") == 0


def test_a_dead_letter_whose_every_known_option_is_null_is_replayed(queues, prefix):
    """The shape check lets any known option be null ("not set"), so the worker ran such a message
    and dead-lettered it. Its replay reads ``replays`` as absent, and the project's send hooks
    (idempotency keys, scrubbing) that run over the replay read the nulls as unset: nothing
    stops the replay, whose body the worker then takes."""
    broker = queues.broker
    queue = f"{prefix}nulls"
    message: Message[Any] = Message(queue, "record", ("n",), {}, dict.fromkeys(OPTION_SHAPES))
    assert decode(message.encode(), queue) == message  # well formed
    headers = {"x-dl-reason": "retries_exhausted", "x-dl-actor": "record", "x-dl-queue": queue}
    broker.publish_dead_letter(message.encode(), headers, message.message_id, queue)
    outcome = ops.replay(broker, [queue + ".DLQ"], ops.Filters())
    assert (outcome.done, outcome.skipped, outcome.failed, outcome.notes) == (1, 0, 0, [])
    (replayed,) = queues.peek(queue)
    body = json.loads(replayed["payload"])
    assert body["message_id"] == message.message_id and body["options"]["replays"] == 1
    assert isinstance(decode(replayed["payload"].encode(), queue), Message)  # the worker takes it
    assert queues.depth(queue + ".DLQ") == 0


def test_a_purge_whose_reader_connection_is_lost_between_queues_ends_with_what_it_purged(
    queues, prefix, monkeypatch
):
    """The first queue's letters are purged, their acks confirmed; then the reader's connection is
    gone (closed here, as a restart of RabbitMQ would drop it). The next queue's first read raised
    pika's error: jobctl ended with a traceback and no word of the letters already purged. The
    purge ends with them counted and a note naming the error's class; the second queue's letters
    stay, and stay listed."""
    broker = queues.broker
    first, second = _dead_letters(broker, f"{prefix}first"), _dead_letters(broker, f"{prefix}second")
    settle = Reader.settle

    def settle_then_lose(reader: Reader, dead_letter_queue: str) -> bool:
        settled = settle(reader, dead_letter_queue)
        reader.connection.close()
        return settled

    monkeypatch.setattr(Reader, "settle", settle_then_lose)
    outcome = ops.purge(broker, [first, second], ops.Filters())
    assert (outcome.done, outcome.unconfirmed) == (COUNT, 0) and outcome.stopped is not None
    assert outcome.notes == [
        "stopped: reading the dead letters failed, RabbitMQ closed or lost the connection"
        f" ({outcome.stopped}): the letters not yet purged stay dead letters; run the command again"
    ]
    assert queues.depth(first) == 0 and _indexed(broker, f"{prefix}first") == 0
    assert queues.depth(second) == COUNT and _indexed(broker, f"{prefix}second") == COUNT


def test_a_retry_leaves_a_letter_whose_idempotency_key_is_refused_and_replays_the_others(queues, prefix):
    """A letter published by hand, not through the project (no ``idempotency_registered``), whose
    key is "": the bulk send's key check (the project's idempotency middleware) refuses the whole
    batch with IdempotencyKeyError, and the retry raised it, replaying none of the letters. That
    letter stays a dead letter, listed, with a note; the others are replayed and removed."""
    broker = queues.broker
    queue = f"{prefix}keys"
    good: list[Message[Any]] = [Message(queue, "record", (f"g{n}",), {}, {}) for n in range(2)]
    empty: Message[Any] = Message(queue, "record", ("e",), {}, {"idempotency_key": ""})
    headers = {"x-dl-reason": "retries_exhausted", "x-dl-actor": "record", "x-dl-queue": queue}
    for message in (good[0], empty, good[1]):
        broker.publish_dead_letter(message.encode(), headers, message.message_id, queue)
    assert broker.dead_letter_index.flush(10)
    outcome = ops.replay(broker, [queue + ".DLQ"], ops.Filters())
    assert (outcome.done, outcome.skipped, outcome.failed, outcome.stopped) == (2, 1, 0, None)
    assert "idempotency key is refused" in outcome.notes[0]
    assert sorted(json.loads(m["payload"])["message_id"] for m in queues.peek(queue)) == sorted(
        m.message_id for m in good
    )
    (left,) = queues.peek(queue + ".DLQ")
    assert json.loads(left["payload"])["message_id"] == empty.message_id
    assert _indexed(broker, queue) == 1
