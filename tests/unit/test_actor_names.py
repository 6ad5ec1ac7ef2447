"""A message's actor name is the sender's text: every place that logs, records or reports it keeps
it only when the broker has that actor, else ``unknown`` (the end-to-end check, a real worker with
Sentry, is ``tests/integration/test_actor_label.py``)."""

from __future__ import annotations

import logging
import sys
from typing import Any
from unittest import mock

import dramatiq
import pika
import pytest
import structlog
from dramatiq import Message
from dramatiq.errors import ActorNotFound

from jobsystem.dramatiq_internals import UNDEFINED_ACTOR_FORMAT, mark_dead_lettered
from jobsystem.observability.sentry import scrub_event
from jobsystem.ops import dead_letter_reader
from jobsystem.privacy.message_logs import HideMessageArguments
from jobsystem.privacy.scrub import Scrubber
from jobsystem.rabbitmq.dead_letter_indexer import entry_from_headers
from jobsystem.runtime.actor_names import UNKNOWN_ACTOR, actor_label
from middleware.dead_letters import DeadLetters
from middleware.lifecycle import JobLifecycle
from middleware.metrics import _labels
from middleware.status import Status
from tests.unit.stub import RecordingBroker, delivery

#: What a sender may put where an actor's name goes: an e-mail address, a person's name shaped as
#: an identifier (only the broker's actors tell it apart), a name with spaces, a non-string.
BOGUS = ["ana@example.com", "Ana_Lopez_1980", "Ana Lopez", "", None, 7]


@pytest.fixture
def broker() -> RecordingBroker:
    broker = RecordingBroker()
    dramatiq.actor(broker=broker, actor_name="job", queue_name="work")(lambda *args: None)
    return broker


def _message(actor: object) -> dramatiq.Message[Any]:
    return dramatiq.Message("work", actor, (), {}, {})  # type: ignore[arg-type]


@pytest.mark.parametrize("name", BOGUS)
def test_a_name_the_broker_lacks_is_unknown_and_a_registered_one_is_kept(broker, name):
    assert actor_label(name, broker.actors) == UNKNOWN_ACTOR
    assert actor_label("job", broker.actors) == "job"
    # Without the broker's actors (a reader), only what could be an actor's name is kept.
    assert actor_label("ana@example.com") == actor_label(None) == UNKNOWN_ACTOR
    assert actor_label("job") == "job"


@pytest.mark.parametrize(("actor", "shown"), [("Ana_Lopez_1980", UNKNOWN_ACTOR), ("job", "job")])
def test_lifecycle_lines_name_only_a_registered_actor(broker, actor, shown):
    lifecycle = JobLifecycle(scrub=lambda value: value)
    proxy = delivery(_message(actor))
    mark_dead_lettered(proxy, "unknown_actor")
    with structlog.testing.capture_logs() as events:
        lifecycle.after_enqueue(broker, _message(actor), None)
        lifecycle.after_nack(broker, proxy)
    assert [(e["event"], e["actor"]) for e in events] == [
        ("job_enqueued", shown),
        ("job_dead_lettered", shown),
    ]


@pytest.mark.parametrize(("actor", "shown"), [("Ana_Lopez_1980", UNKNOWN_ACTOR), ("job", "job")])
def test_the_status_record_names_only_a_registered_actor(broker, store, actor, shown):
    status = Status(store)
    proxy = delivery(_message(actor))
    status.after_nack(broker, proxy)
    assert status.flush(10)
    record = status.get(proxy.message_id)
    assert record is not None and (record.state, record.actor) == ("dead", shown)


@pytest.mark.parametrize(
    ("actor", "shown"), [("send_invoice", "send_invoice"), ("ana@example.com", UNKNOWN_ACTOR)]
)
def test_a_sender_records_the_name_of_an_actor_it_does_not_import(broker, store, actor, shown):
    # A service may send to another's actors by name; its record is written once, at the send,
    # so "unknown" there would stay for good. The sender's own code chose the name.
    status = Status(store)
    message = _message(actor)
    status.after_enqueue(broker, message, None)
    assert status.flush(10)
    record = status.get(message.message_id)
    assert record is not None and (record.state, record.actor) == ("queued", shown)


def test_metrics_label_only_a_registered_actor(broker):
    assert _labels(broker, _message("Ana_Lopez_1980"))[1] == UNKNOWN_ACTOR
    assert _labels(broker, _message("job"))[1] == "job"


def test_the_dead_letter_of_an_unknown_actor_names_it_nowhere(broker):
    name = BOGUS[1]  # not written in a line the traceback quotes
    try:
        broker.get_actor(name)
    except ActorNotFound as error:
        record = DeadLetters().record(broker, delivery(_message(name)), error)
    assert record["x-dl-exception"] == "ActorNotFound" and record["x-dl-error"] == UNKNOWN_ACTOR
    assert "get_actor" in record["x-dl-traceback"] and "Ana" not in str(record)


def test_dramatiqs_undefined_actor_line_names_no_actor():
    name = BOGUS[1]  # not written in a line the traceback quotes
    try:
        raise ActorNotFound(name)  # type: ignore[no-untyped-call]
    except ActorNotFound:
        exc_info = sys.exc_info()
    record = logging.LogRecord(
        "dramatiq.worker.ConsumerThread",
        logging.ERROR,
        __file__,
        1,
        UNDEFINED_ACTOR_FORMAT,
        ("Ana_Lopez_1980",),
        exc_info,
    )
    assert HideMessageArguments().filter(record)
    assert record.getMessage() == "Received message for undefined actor 'unknown'. Moving it to the DLQ."
    assert record.exc_info is not None and str(record.exc_info[1]) == UNKNOWN_ACTOR
    assert "Ana" not in logging.Formatter().format(record)


def test_sentry_tags_name_only_a_registered_actor(broker):
    """Tags come from the job context JobLifecycle binds, or from the integration's, which only
    messages whose actor ran have; a name that cannot be an actor's is dropped there too."""
    lifecycle = JobLifecycle(scrub=lambda value: value)
    for actor, shown in (("Ana_Lopez_1980", UNKNOWN_ACTOR), ("job", "job")):
        proxy = delivery(_message(actor))
        with structlog.testing.capture_logs():
            lifecycle.before_process_message(broker, proxy)
            event = scrub_event(Scrubber(), {"message": "x"})
            lifecycle.after_process_message(broker, proxy)
        assert event is not None and event["tags"]["actor"] == shown
    data = {"actor_name": "ana@example.com", "queue_name": "emails", "message_id": "m-2"}
    event = scrub_event(Scrubber(), {"contexts": {"dramatiq": {"data": data}}})
    assert event is not None and event["tags"]["actor"] == UNKNOWN_ACTOR


#: Names Dramatiq takes for an actor that are not Python identifiers.
NOT_IDENTIFIERS = ["emails.send", "send-email", "billing:charge"]


@pytest.mark.parametrize("name", NOT_IDENTIFIERS)
def test_an_actor_name_that_is_no_identifier_is_kept_without_a_registry(broker, store, name):
    """A sender's record (written once), Sentry's tags and the index keep the registered
    ``emails.send``: without the registry, the shape of an actor's name decides, not ``isidentifier``."""
    assert actor_label(name) == name and actor_label(name, {name}) == name
    status = Status(store)
    message = _message(name)
    status.after_enqueue(broker, message, None)
    assert status.flush(10)
    record = status.get(message.message_id)
    assert record is not None and record.actor == name
    data = {"actor_name": name, "queue_name": "emails", "message_id": "m-1"}
    event = scrub_event(Scrubber(), {"contexts": {"dramatiq": {"data": data}}})
    assert event is not None and event["tags"]["actor"] == name
    assert entry_from_headers("p-work", "m1", {"x-dl-actor": name}).actor == name


@pytest.mark.parametrize("name", ["ana@example.com", "Ana Lopez", "ana\nlopez", "1ana", ".x", "x" * 201])
def test_a_name_no_actor_can_have_is_unknown_without_a_registry(name):
    assert actor_label(name) == UNKNOWN_ACTOR


@pytest.mark.parametrize(("actor", "shown"), [("Ana_Lopez_1980", UNKNOWN_ACTOR), ("job", "job")])
def test_a_worker_releasing_a_delayed_message_records_only_a_registered_actor(broker, store, actor, shown):
    """The worker's move of a ``.DQ`` message to its queue runs ``after_enqueue``; the record's
    actor, written once there, names no sender's text (the later ``dead`` cannot replace it)."""
    status = Status(store)
    status.before_worker_boot(broker, mock.Mock())
    message = _message(actor)
    status.after_enqueue(broker, message, None)
    assert status.flush(10)
    record = status.get(message.message_id)
    assert record is not None and (record.state, record.actor) == ("queued", shown)


def test_an_actor_sending_from_a_worker_is_a_sender(broker, store):
    """An actor may send to another service's actors by name: its send keeps the name."""
    status = Status(store)
    status.before_worker_boot(broker, mock.Mock())
    running = delivery(_message("job"))
    status.before_process_message(broker, running)
    sent = _message("emails.send")
    status.after_enqueue(broker, sent, None)
    status.after_process_message(broker, running)
    moved = _message("Ana_Lopez_1980")
    status.after_enqueue(broker, moved, None)  # the actor is done: the worker's own move
    assert status.flush(10)
    assert [status.get(m.message_id).actor for m in (sent, moved)] == ["emails.send", UNKNOWN_ACTOR]  # type: ignore[union-attr]


def test_a_send_from_a_thread_without_the_actors_context_fails_closed(broker, store):
    """What marks a send as an actor's is its context, not its thread (Dramatiq's event loop runs
    an async actor in the worker thread's context): a thread the actor starts with its context
    is a sender; one started without it (``run_in_executor``) is taken for the worker's own move."""
    import contextvars
    import threading

    status = Status(store)
    status.before_worker_boot(broker, mock.Mock())
    status.before_process_message(broker, delivery(_message("job")))
    sent = {"with": _message("billing.charge"), "without": _message("billing.charge")}
    context = contextvars.copy_context()
    for target in (
        lambda: context.run(status.after_enqueue, broker, sent["with"], None),
        lambda: status.after_enqueue(broker, sent["without"], None),
    ):
        thread = threading.Thread(target=target)
        thread.start()
        thread.join(10)
    assert status.flush(10)
    assert {k: status.get(m.message_id).actor for k, m in sent.items()} == {  # type: ignore[union-attr]
        "with": "billing.charge",
        "without": UNKNOWN_ACTOR,
    }


def test_a_letter_rabbitmq_dead_lettered_itself_names_only_an_actor_of_the_readers_broker():
    """``jobctl dlq`` and a re-index read an ``x-death`` letter (no record a worker checked)
    with the broker's actors: a person's name shaped as an identifier is not shown."""
    headers = {"x-death": [{"reason": "rejected", "count": 1}]}
    letters = [
        (Message("p-work", name, (), {}, {}).encode(), pika.BasicProperties(message_id=name, headers=headers))
        for name in ("Ana_Lopez_1980", "job")
    ]
    channel = mock.Mock()
    channel.queue_declare.return_value.method.message_count = len(letters)
    channel.basic_get.side_effect = [(mock.Mock(delivery_tag=n), p, b) for n, (b, p) in enumerate(letters)]
    connection = mock.Mock(channel=mock.Mock(return_value=channel))
    broker = mock.Mock(parameters=pika.ConnectionParameters(), actors={"job": object()})
    with mock.patch("jobsystem.ops.dead_letter_reader.pika.BlockingConnection", return_value=connection):
        read = [dead for dead, _ in dead_letter_reader.Reader(broker).stream("p-work.DLQ")]
    assert [dead.actor for dead in read] == [UNKNOWN_ACTOR, "job"]
    assert [dead.index_entry().actor for dead in read] == [UNKNOWN_ACTOR, "job"]
