"""Dead-letter purge and retry stopped midway (a connection lost, the store down, a queue that cannot
be declared, a letter whose key is refused) end with what they did and a note naming the error by
class, never a traceback. Without RabbitMQ, as ``test_dlq_replay``."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import dramatiq
import pika.exceptions
import pytest
from click.testing import CliRunner
from dramatiq import Message

from jobctl import dlq
from jobsystem.ops import dead_letters as ops
from jobsystem.store import open_store
from jobsystem.store.base import StoreUnavailable
from middleware.idempotency import Idempotency
from tests.unit.dead_letter_standins import (
    LOST,
    TWO_QUEUES,
    StandInQueues,
    letters_of,
    reader_lost_at_read,
    stand_in_queues,
)
from tests.unit.stub import RecordingBroker
from tests.unit.test_dlq_replay import NO_INDEX, _Queues


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> Any:
    return stand_in_queues(monkeypatch)


def test_a_purge_whose_connection_is_lost_between_queues_ends_with_what_it_purged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first queue's letters are purged (their acks settled); the connection is lost before the
    next queue's first letter is read. The purge raised pika's StreamLostError: jobctl ended with a
    traceback and no word of the two letters already gone."""
    queues = _Queues({name: letters_of(name, 2) for name in TWO_QUEUES})
    monkeypatch.setattr(ops, "Reader", reader_lost_at_read(queues, 2))
    outcome = ops.purge(NO_INDEX, TWO_QUEUES, ops.Filters())  # type: ignore[arg-type]
    assert (outcome.done, outcome.unconfirmed, outcome.stopped, queues.acked) == (
        2,
        0,
        "StreamLostError",
        [1, 2],
    )
    assert outcome.notes == [
        "stopped: reading the dead letters failed, RabbitMQ closed or lost the connection"
        " (StreamLostError): the letters not yet purged stay dead letters; run the command again"
    ]


def test_a_purge_whose_ack_fails_names_the_acks_not_confirmed_and_stops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The second ack finds the channel closed (pika raises ChannelWrongStateError): the first ack,
    sent, may not have arrived, nor the second. Both are counted unconfirmed (they stay listed;
    running again is safe), and the purge stops with a note rather than a traceback."""
    queues = _Queues({"p-work.DLQ": letters_of("p-work.DLQ", 3)})
    reader = queues.reader

    def losing_reader(broker: Any) -> Any:
        made_reader = reader(broker)
        ack = made_reader.ack

        def lost(tag: int) -> None:
            if tag == 2:
                raise pika.exceptions.ChannelWrongStateError("Channel is closed.")
            ack(tag)

        made_reader.ack = lost
        return made_reader

    monkeypatch.setattr(ops, "Reader", losing_reader)
    outcome = ops.purge(NO_INDEX, ["p-work.DLQ"], ops.Filters())  # type: ignore[arg-type]
    assert (outcome.done, outcome.unconfirmed, outcome.matched) == (0, 2, 2)
    assert outcome.stopped == "ChannelWrongStateError"
    assert "2 acked but not confirmed" in outcome.notes[0] and "run the command again" in outcome.notes[0]
    assert outcome.notes[1].startswith("stopped: reading the dead letters failed")


def test_a_replay_whose_connection_is_lost_at_the_next_read_ends_with_what_it_replayed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A first batch of two is replayed and removed; the reader's connection is lost when the third
    letter is read. Nothing more is published (the letters read after it could not be removed),
    and the outcome says two were retried and the rest stay, where the replay raised."""
    queues = _Queues({"p-work.DLQ": letters_of("p-work.DLQ", 4)})
    monkeypatch.setattr(ops, "Reader", reader_lost_at_read(queues, 2))
    monkeypatch.setattr(ops, "send_bulk", queues.send_bulk)
    outcome = ops.replay(NO_INDEX, ["p-work.DLQ"], ops.Filters(), batch_size=2)  # type: ignore[arg-type]
    assert len(queues.published) == 2 and queues.acked == [1, 2]
    assert (outcome.done, outcome.unconfirmed, outcome.stopped) == (2, 0, "StreamLostError")
    assert outcome.notes == [
        "stopped: reading the dead letters failed, RabbitMQ closed or lost the connection"
        " (StreamLostError): the letters not yet replayed stay dead letters; run the command again"
    ]
    assert "10.0.0.5" not in " ".join(outcome.notes)


@pytest.mark.parametrize(
    ("command", "summary"),
    [
        (["purge", "--all", "--yes"], "purged 2 dead letter(s) so far"),
        (["retry", "--all"], "retried 2 of 2 matching so far"),
    ],
)
def test_jobctl_ends_a_stopped_operation_with_its_summary_and_fails(
    monkeypatch: pytest.MonkeyPatch, command: list[str], summary: str
) -> None:
    """The connection is lost between the two queues: jobctl prints what was done and why it
    stopped, and exits 1, where it ended with pika's traceback."""
    queues = _Queues({name: letters_of(name, 2) for name in TWO_QUEUES})
    monkeypatch.setattr(ops, "Reader", reader_lost_at_read(queues, 2))
    monkeypatch.setattr(ops, "send_bulk", queues.send_bulk)
    monkeypatch.setattr(dlq, "Context", StandInQueues)
    result = CliRunner().invoke(dlq.dlq, command)
    assert isinstance(result.exception, SystemExit) and result.exit_code == 1, result.output
    assert summary in result.stdout and "(StreamLostError)" in result.stdout
    assert "10.0.0.5" not in result.output


@pytest.fixture
def keyed(made: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A broker with the project's idempotency middleware on a SQLite store, whose actor ``job``
    of ``p-work`` has a key function that raises for ``bad=True``; the stand-in send runs the
    middleware's check of a batch's keys first, as the real bulk send does."""
    store = open_store(f"sqlite:///{tmp_path}/state.db")
    idempotency = Idempotency(store)
    broker = RecordingBroker(middleware=[idempotency])
    broker.dead_letter_index = None  # type: ignore[attr-defined]
    broker.environment = "p-"  # type: ignore[attr-defined]

    def job(token: str, bad: bool = False) -> None: ...

    def key(token: str, bad: bool = False) -> str:
        if bad:
            raise ValueError("no key for this one")
        return token

    dramatiq.actor(broker=broker, actor_name="job", queue_name="p-work", idempotency_key=key)(job)

    def make(letters: list[Message[Any]]) -> _Queues:
        queues: _Queues = made(letters)

        def send(messages: list[Message[Any]], *, broker: Any) -> list[Message[Any]]:
            for middleware in broker.middleware:  # raises as send_bulk's _register does
                middleware.before_enqueue_batch(broker, messages)
            return queues.send_bulk(messages, broker=broker)

        monkeypatch.setattr(ops, "send_bulk", send)
        return queues

    yield SimpleNamespace(broker=broker, idempotency=idempotency, make=make)
    idempotency.writes.stop()
    broker.close()
    store.close()


def test_a_letter_whose_idempotency_key_is_refused_is_skipped_and_the_others_replayed(keyed: Any) -> None:
    """A letter the project did not send (no ``idempotency_registered``) whose key is "", and one
    whose actor's key function raises: the send refuses the whole batch with IdempotencyKeyError,
    and the replay raised it, replaying none of the good letters around them. Each bad one stays
    a dead letter with a reason; the others are replayed."""
    good: list[Message[Any]] = [Message("p-work", "job", (f"t{n}",), {}, {}) for n in range(2)]
    empty: Message[Any] = Message("p-work", "job", ("t9",), {}, {"idempotency_key": ""})
    raising: Message[Any] = Message("p-work", "job", ("t8",), {"bad": True}, {})
    queues = keyed.make([good[0], empty, raising, good[1]])
    outcome = ops.replay(keyed.broker, ["p-work.DLQ"], ops.Filters())
    assert [m.message_id for m in queues.published] == [m.message_id for m in good]
    assert queues.acked == [1, 4]  # the bad ones stay where they are
    assert (outcome.done, outcome.skipped, outcome.failed, outcome.stopped) == (2, 2, 0, None)
    assert outcome.notes == [
        "2 not replayed, their idempotency key is refused (empty, not a string or number, or their"
        " actor's idempotency_key function raised): they stay dead letters (fix the function or the"
        " sender; export or purge them)"
    ]


def test_a_replay_whose_state_store_is_down_stops_with_what_it_replayed(
    keyed: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The store stops answering after a first batch: the send's key check raises
    IdempotencyStoreError, before anything of the second batch is published. The replay raised
    it with a traceback; it ends now with the first batch counted, a note naming the cause by
    class (the store's address only in the DEBUG line), and the letters left in their queue."""
    letters: list[Message[Any]] = [Message("p-work", "job", (f"t{n}",), {}, {}) for n in range(4)]
    queues = keyed.make(letters)
    register = keyed.idempotency.backend.register_many
    calls = [0]

    def down(items: Any) -> Any:
        calls[0] += 1
        if calls[0] == 2:
            try:
                raise ConnectionError("Error 111 connecting to 10.0.0.5:6379. Connection refused.")
            except ConnectionError as exc:
                raise StoreUnavailable(f"redis: {exc}") from exc
        return register(items)

    monkeypatch.setattr(keyed.idempotency.backend, "register_many", down)
    caplog.set_level(logging.DEBUG, logger="jobsystem.ops")
    outcome = ops.replay(keyed.broker, ["p-work.DLQ"], ops.Filters(), batch_size=2)
    assert [m.message_id for m in queues.published] == [m.message_id for m in letters[:2]]
    assert queues.acked == [1, 2]
    assert (outcome.done, outcome.failed, outcome.stopped) == (2, 0, "IdempotencyStoreError")
    assert outcome.notes == [
        "stopped: the state store did not answer the replays' idempotency check (IdempotencyStoreError:"
        " ConnectionError): 2 read and not replayed (none published) and those not yet read stay dead"
        " letters; run the command again once the store answers"
    ]
    (line,) = [r for r in caplog.records if r.getMessage() == "dead_letter_replay_stopped"]
    assert (line.levelno, line.error, line.cause) == (logging.WARNING, "StoreUnavailable", "ConnectionError")  # type: ignore[attr-defined]
    assert all("10.0.0.5" not in str(vars(r)) for r in caplog.records if r.levelno > logging.DEBUG)


def test_a_replay_whose_queue_cannot_be_declared_stops_with_what_it_replayed(
    made: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bulk send declares the replays' queue before it publishes; a declare that fails
    (Dramatiq's ConnectionClosed after its attempts, its text quoting pika's: an address) is raised
    before anything is published. The replay raised it; it ends now with the first batch counted
    and the error named by its class."""
    letters: list[Message[Any]] = [Message("p-work", "job", (), {}, {}) for _ in range(4)]
    queues: _Queues = made(letters)
    send = queues.send_bulk

    def declare_fails(messages: list[Message[Any]], *, broker: Any) -> list[Message[Any]]:
        if queues.published:
            raise dramatiq.errors.ConnectionClosed(pika.exceptions.StreamLostError(LOST))  # type: ignore[no-untyped-call]
        return send(messages, broker=broker)

    monkeypatch.setattr(ops, "send_bulk", declare_fails)
    outcome = ops.replay(NO_INDEX, ["p-work.DLQ"], ops.Filters(), batch_size=2)  # type: ignore[arg-type]
    assert len(queues.published) == 2 and queues.acked == [1, 2]
    assert (outcome.done, outcome.stopped) == (2, "ConnectionClosed")
    assert outcome.notes == [
        "stopped: the replays could not be published (ConnectionClosed): 2 read and not replayed (none"
        " published) and those not yet read stay dead letters; run the command again once that is fixed"
    ]
