"""Review (faults, area 1): dead letters are replayed without loss, whatever the letter or the fault.

Without RabbitMQ, as ``test_dlq_replay``: a stand-in reader holds the dead letters and a stand-in
bulk send records what is published.
"""

from __future__ import annotations

import logging
from typing import Any

import pika.exceptions
import pytest
from click.testing import CliRunner
from dramatiq import Message
from dramatiq.brokers.rabbitmq import RabbitmqBroker

from jobctl import dlq
from jobsystem.ops import dead_letters as ops
from jobsystem.rabbitmq.bulk import send_bulk
from tests.amqp_server import fake_rabbitmq
from tests.support import within
from tests.unit.dead_letter_standins import stand_in_queues
from tests.unit.test_bulk import Recorder
from tests.unit.test_dlq_replay import NO_INDEX, StandInContext, _Queues


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> Any:
    return stand_in_queues(monkeypatch)


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
    # Replayed all the same: named to purge, never to retry again (a second publish of the id).
    assert (outcome.done, outcome.unremoved) == (1, [message.message_id])
    assert "Do not retry them again" in outcome.notes[0] and message.message_id in outcome.notes[0]


def _losing_reader(queues: _Queues, *, fail_at: int | None, settles: bool) -> Any:
    """The stand-in reader whose ack number ``fail_at`` (1-based) finds the connection gone, and
    whose round trip after the acks answers or not (``settles``)."""

    def reader(broker: Any) -> Any:
        made_reader = queues.reader(broker)
        acks = made_reader.ack

        def ack(tag: int) -> None:
            if fail_at is not None and len(queues.acked) + 1 >= fail_at:
                raise pika.exceptions.StreamLostError("Stream connection lost")
            acks(tag)

        def settle(name: str) -> bool:
            if not settles:
                made_reader.failure = "StreamLostError"  # as the real reader notes it
            return settles

        made_reader.ack = ack
        made_reader.settle = settle
        return made_reader

    return reader


@pytest.mark.parametrize(
    ("fail_at", "settles"), [(2, False), (None, False)], ids=["ack-lost-midway", "acks-not-settled"]
)
def test_every_replayed_letter_whose_removal_is_unsure_is_named_to_purge_and_the_replay_stops(
    made: Any, monkeypatch: pytest.MonkeyPatch, fail_at: int | None, settles: bool
) -> None:
    """Three replays confirmed; the connection is lost at the second ack, or after the acks before
    RabbitMQ answered the round trip: all three may still be dead letters (an ack sent before the
    loss may not have arrived). Each is counted replayed and named: the note tells the operator
    to purge, not to run the retry again, which would publish the same message ids a second time.
    The letters after the batch are not read (the reader is unusable)."""
    letters: list[Message[Any]] = [Message("p-work", "job", (), {}, {}) for _ in range(4)]
    queues = made(letters)
    monkeypatch.setattr(ops, "Reader", _losing_reader(queues, fail_at=fail_at, settles=settles))
    outcome = ops.replay(NO_INDEX, ["p-work.DLQ"], ops.Filters(), batch_size=3)  # type: ignore[arg-type]
    first = [m.message_id for m in letters[:3]]
    assert [m.message_id for m in queues.published] == first
    assert (outcome.done, outcome.unconfirmed, outcome.unremoved) == (3, 3, first)
    assert outcome.stopped == "StreamLostError"  # so the dashboard audits it stopped, not done
    assert "purge them" in outcome.notes[0] and "run the command again" not in " ".join(outcome.notes)


def test_jobctl_retry_names_every_replayed_letter_left_unsure_and_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ids = [f"id-{n}" for n in range(12)]  # more than the note shows
    unsure = ops.Outcome(matched=12, done=12, unconfirmed=12, unremoved=ids, notes=["12 replayed, ..."])

    monkeypatch.setattr(dlq, "Context", StandInContext)
    monkeypatch.setattr(ops, "replay", lambda *args, **kwargs: unsure)
    result = CliRunner().invoke(dlq.dlq, ["retry", "--all"])
    assert result.exit_code == 1
    assert f"replayed, maybe still dead letters: {' '.join(ids)}" in result.stderr


@pytest.mark.parametrize("command", [["retry"], ["purge", "--yes"]])
def test_jobctl_names_the_ids_given_that_matched_nothing_even_when_another_failed(
    monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    """``id-1`` was found and failed (a replay RabbitMQ did not confirm, an ack not confirmed),
    ``id-2`` matched no dead letter (a typo): both make the exit 1, and the typo is named, where
    the check for ids not found was skipped once something else had failed."""
    failed = ops.Outcome(matched=1, failed=1, unconfirmed=1, found={"id-1"}, notes=["1 failed"])
    monkeypatch.setattr(dlq, "Context", StandInContext)
    monkeypatch.setattr(ops, "replay", lambda *args, **kwargs: failed)
    monkeypatch.setattr(ops, "purge", lambda *args, **kwargs: failed)
    result = CliRunner().invoke(dlq.dlq, [*command, "id-1", "id-2"])
    assert result.exit_code == 1
    assert "no dead letter id-2" in result.stderr


def test_a_replay_rabbitmq_did_not_confirm_is_noted_by_the_errors_class_never_its_address(
    made: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A node that accepts TCP and never speaks AMQP: pika's handshake timeout names RabbitMQ's
    host and port, and the replay's note went, with it, into jobctl's output, the dashboard's
    answer and its audit log. The note names the error's class; the text is logged at DEBUG."""
    message: Message[Any] = Message("p-work", "job", (), {}, {})
    queues = made([message])
    with fake_rabbitmq(speak=False) as rabbit:
        target = RabbitmqBroker(url=rabbit.url(), middleware=[Recorder()])
        monkeypatch.setattr(target, "declare_queue", lambda queue_name, ensure=False: None)
        parameters: Any = target.parameters
        parameters.stack_timeout = 0.5
        monkeypatch.setattr(ops, "send_bulk", lambda messages, broker: send_bulk(messages, broker=target))
        caplog.set_level(logging.DEBUG, logger="jobsystem.ops.dead_letters")
        outcome = within(10, lambda: ops.replay(NO_INDEX, ["p-work.DLQ"], ops.Filters()))  # type: ignore[arg-type]
        host, port = parameters.host, str(parameters.port)
    assert (outcome.done, outcome.failed, queues.acked) == (0, 1, [])
    assert outcome.notes == [
        "1 not replayed, RabbitMQ did not confirm their publish (ConnectionOpenAborted): they stay"
        " dead letters (one whose publish was lost with its connection may have been queued all the same)"
    ]
    (line,) = [r for r in caplog.records if r.getMessage() == "dead_letter_replay_unconfirmed"]
    (cause,) = [r for r in caplog.records if r.getMessage() == "dead_letter_replay_unconfirmed_cause"]
    assert (line.levelno, line.error, line.failed) == (logging.WARNING, "ConnectionOpenAborted", 1)  # type: ignore[attr-defined]
    assert cause.levelno == logging.DEBUG and host in cause.error and port in cause.error  # type: ignore[attr-defined]


# -- dlq2: an operation that cannot go on ends with what it did, never a traceback ---------------

#: pika's text for a lost connection: an address, never to be shown.
