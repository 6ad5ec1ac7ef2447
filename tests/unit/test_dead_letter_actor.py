"""The actor a dead letter names is an actor's name or the placeholder, never the sender's text:
written so by the records, and shown so by every reader of a letter whose header says otherwise
(in a queue or the index from before the records checked it, or published by hand); what
``jobctl dlq`` prints of such a letter is tested with its other views (``test_dlq_views``)."""

from __future__ import annotations

import json
from typing import Any
from unittest import mock

import dramatiq
import pika
import pytest
from dramatiq.errors import ActorNotFound

from dashboard.dead_letters import dead_letter_list, shown_entry
from jobsystem.ops.dead_letter_reader import DeadLetter
from jobsystem.rabbitmq.dead_letter_indexer import entry_from_headers
from jobsystem.runtime.actor_names import UNKNOWN_ACTOR, actor_label
from jobsystem.runtime.message_shape import decode
from jobsystem.store.dead_letter_index import DeadLetterEntry, IndexPage
from middleware.dead_letters import DeadLetters
from tests.unit.stub import RecordingBroker, delivery

#: What a sender may put where an actor's name goes: an e-mail address, a person's name, a
#: phone number, text that is not UTF-8, nothing.
BOGUS = ["ana@example.com", "Ana Lopez", "+34 600 000 000", "x\udc80", ""]
#: Names of an actor's shape but no actor's: only the writer, which has the registry, tells them apart.
ACTOR_SHAPED = ["ana_lopez", "ana.lopez"]


@pytest.fixture
def broker() -> RecordingBroker:
    broker = RecordingBroker(middleware=[DeadLetters()])
    dramatiq.actor(broker=broker, actor_name="job", queue_name="work")(lambda *args: None)
    return broker


@pytest.mark.parametrize("actor", [*BOGUS, *ACTOR_SHAPED])
def test_a_message_of_no_registered_actor_is_recorded_with_the_placeholder(broker, actor):
    proxy = delivery(dramatiq.Message("work", actor, (), {}, {}))
    record = DeadLetters().record(broker, proxy, ActorNotFound(actor))  # type: ignore[no-untyped-call]
    assert record["x-dl-reason"] == "unknown_actor" and record["x-dl-actor"] == UNKNOWN_ACTOR


def test_a_registered_actor_is_recorded_by_name(broker):
    proxy = delivery(dramatiq.Message("work", "job", (), {}, {}))
    assert DeadLetters().record(broker, proxy, RuntimeError("down"))["x-dl-actor"] == "job"


@pytest.mark.parametrize(("actor", "recorded"), [("ana@example.com", UNKNOWN_ACTOR), ("job", "job")])
def test_a_malformed_body_names_its_actor_only_when_it_is_a_registered_one(broker, actor, recorded):
    body = json.dumps({"queue_name": "work", "actor_name": actor, "args": 5}).encode()
    malformed = decode(body, "work")
    assert not isinstance(malformed, dramatiq.Message) and malformed.actor_name == actor
    assert DeadLetters().malformed_record(broker, "work", malformed)["x-dl-actor"] == recorded


def _dead(body: bytes, headers: dict[str, Any]) -> DeadLetter:
    return DeadLetter.from_delivery(
        "p-work.DLQ", pika.BasicProperties(message_id="m1", headers=headers), body
    )


@pytest.mark.parametrize("actor", [*BOGUS, b"ana@example.com", 7])
def test_a_letter_whose_header_names_no_actor_is_read_with_the_placeholder(actor):
    """``jobctl dlq list/show/export`` and a re-index read letters with this; so does the indexer."""
    headers = {"x-dl-reason": "unknown_actor", "x-dl-actor": actor}
    dead = _dead(b"{}", headers)
    assert dead.actor == UNKNOWN_ACTOR and dead.index_entry().actor == UNKNOWN_ACTOR
    assert entry_from_headers("p-work", "m1", headers).actor == UNKNOWN_ACTOR


def test_a_letter_rabbitmq_dead_lettered_itself_names_its_actor_only_when_it_can_be_one():
    bogus = dramatiq.Message("p-work", "ana@example.com", (), {}, {}).encode()
    assert _dead(bogus, {"x-death": [{"reason": "rejected"}]}).actor == UNKNOWN_ACTOR
    good = dramatiq.Message("p-work", "send_email", (), {}, {}).encode()
    assert _dead(good, {"x-death": [{"reason": "rejected"}]}).actor == "send_email"
    assert _dead(b"\xff junk", {}).actor == UNKNOWN_ACTOR


def _entry(actor: str) -> DeadLetterEntry:
    return DeadLetterEntry("p-work", "m1", actor, "unknown_actor", "", "", "", 0, None, 1)


def test_the_dashboard_shows_an_entry_indexed_with_the_senders_text_with_the_placeholder():
    """Entries indexed before the records checked the actor keep it until a re-index."""
    index = mock.Mock()
    index.page.return_value = IndexPage([_entry("Ana Lopez"), _entry("job")], None)
    index.counts.return_value = {"p-work": 2}
    index.facets.return_value = {"actor": ["Ana Lopez", "ana@example.com", "job"], "exception": [""]}
    project = mock.Mock(dead_letter_index=index)
    with mock.patch("dashboard.dead_letters.rabbitmq_counts", return_value={"p-work": 2}):
        data = dead_letter_list(project, None)
    assert [d["actor"] for d in data["dead_letters"]] == [UNKNOWN_ACTOR, "job"]
    assert data["facets"]["actor"] == sorted([UNKNOWN_ACTOR, "job"])
    assert "Ana" not in json.dumps(data) and shown_entry(_entry("ana@example.com"))["actor"] == UNKNOWN_ACTOR


def test_an_identifier_is_kept_without_a_registry_and_only_a_registered_one_with_it():
    assert actor_label("send_email") == "send_email" and actor_label("send_email", {"job"}) == UNKNOWN_ACTOR
    assert actor_label(None) == actor_label(["job"]) == UNKNOWN_ACTOR
