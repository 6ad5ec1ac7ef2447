"""Which queues the operator tools take as the project's, with the default, empty, QUEUE_PREFIX:
every queue of a shared vhost begins with it, so the prefix alone must never decide. In memory:
a real broker test with an empty prefix would act on the shared vhost."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import dramatiq
import pika
import pytest
from dramatiq.brokers.stub import StubBroker

from dashboard import dead_letters as dashboard_dead_letters
from dashboard import queues as dashboard_queues
from dashboard.dead_letters import ActionError, Selection
from jobsystem.ops import dead_letters as ops
from jobsystem.ops.dead_letter_reader import DeadLetter
from jobsystem.ops.migration import foreign_queues
from jobsystem.ops.queue_names import resolve_queues
from jobsystem.ops.scope import changeable
from jobsystem.settings import load_settings
from jobsystem.store.base import StoreUnavailable

#: What RabbitMQ has on the vhost: the project's queues and another application's; ``removed``'s
#: ``.DLQ`` holds letters of an actor since removed, from before the index (or the index was lost).
ON_THE_VHOST = [
    *("emails", "emails.DQ", "emails.DLQ", "retired", "retired.DLQ", "billing", "billing.DLQ"),
    "removed.DLQ",
]


class Index:
    """The project's dead-letter index: letters of ``retired``, an actor since removed."""

    def __init__(self, down: bool = False) -> None:
        self.down = down

    def counts(self) -> dict[str, int]:
        if self.down:
            raise StoreUnavailable("no answer")
        return {"retired": 2}


def broker(index: Index | None = None, sent_to: frozenset[str] = frozenset()) -> Any:
    """A broker whose one actor uses ``emails``, and which declared ``sent_to`` too: every publish
    declares its queue (a retry into a removed actor's queue, a send to another service's actor)."""
    return SimpleNamespace(
        actors={"send_email": SimpleNamespace(queue_name="emails")},
        get_declared_queues=lambda: {"emails", *sent_to},
        dead_letter_index=SimpleNamespace(backend=index or Index()),
        environment="",  # the default, empty, QUEUE_PREFIX: the stamp its workers write
    )


@pytest.fixture
def vhost(monkeypatch: pytest.MonkeyPatch) -> None:
    """RabbitMQ as the operations ask it: every queue listed, those not on the vhost missing."""
    monkeypatch.setattr(ops, "queue_names", lambda settings, timeout: ON_THE_VHOST, raising=False)
    monkeypatch.setattr(
        ops,
        "missing_queues",
        lambda settings, names, timeout: [n for n in names if n not in ON_THE_VHOST],
        raising=False,
    )
    monkeypatch.setattr(
        dashboard_queues, "queue_names", lambda settings, timeout: ON_THE_VHOST, raising=False
    )
    monkeypatch.setattr(dashboard_dead_letters, "missing_queues", lambda settings, names: [])

    def act(*args: Any, **kwargs: Any) -> None:
        pytest.fail("acted on dead-letter queues")

    monkeypatch.setattr(ops, "purge", act)


SETTINGS = load_settings({"QUEUE_PREFIX": ""})


@pytest.mark.usefixtures("vhost")
def test_without_a_queue_only_the_projects_dead_letter_queues_are_taken() -> None:
    assert ops.dead_letter_queues(SETTINGS, broker()) == ["emails.DLQ", "retired.DLQ"]
    # The index unanswered: the actors' queues only, still never another application's.
    assert ops.dead_letter_queues(SETTINGS, broker(Index(down=True))) == ["emails.DLQ"]


@pytest.mark.usefixtures("vhost")
def test_a_queue_named_that_is_not_the_projects_is_refused() -> None:
    assert ops.dead_letter_queues(SETTINGS, broker(), "retired") == ["retired.DLQ"]
    with pytest.raises(ops.ForeignQueue, match="'billing' is not a queue of the project's actors"):
        ops.dead_letter_queues(SETTINGS, broker(), "billing")


@pytest.mark.usefixtures("vhost")
def test_the_dashboard_neither_shows_nor_acts_on_another_applications_queue() -> None:
    project = SimpleNamespace(settings=SETTINGS, broker=broker())
    assert dashboard_queues.work_queues(project) == ["emails", "retired"]  # type: ignore[arg-type]
    with pytest.raises(ActionError, match="'billing' is not a queue of the project's actors"):
        dashboard_dead_letters.purge(project, Selection(queue="billing", all=True))  # type: ignore[arg-type]


@pytest.mark.usefixtures("vhost")
def test_a_queue_named_whose_dead_letter_queue_exists_is_read_and_reindexed_not_acted_on(monkeypatch) -> None:
    """Re-indexing is the documented recovery of a removed actor's letters the index lost: the
    queue named is taken for reading and re-indexing; purge and retry wait for the index."""
    assert ops.dead_letter_queues(SETTINGS, broker(), "removed", reading=True) == ["removed.DLQ"]
    with pytest.raises(ops.ForeignQueue):
        ops.dead_letter_queues(SETTINGS, broker(), "nowhere", reading=True)  # no .DLQ: not taken
    with pytest.raises(ops.ForeignQueue, match="'removed' is not a queue of the project's actors"):
        ops.dead_letter_queues(SETTINGS, broker(), "removed")
    project = SimpleNamespace(settings=SETTINGS, broker=broker())
    reindexed: list[str] = []

    def reindex(broker: object, name: str) -> ops.Reindexed:
        reindexed.append(name)
        return ops.Reindexed(3, 1)

    monkeypatch.setattr(ops, "reindex", reindex)
    assert dashboard_dead_letters.reindex(project, "removed") == {"indexed": 3, "left_out": 1}  # type: ignore[arg-type]
    assert reindexed == ["removed.DLQ"]
    with pytest.raises(ActionError, match="'removed' is not a queue of the project's actors"):
        dashboard_dead_letters.purge(project, Selection(queue="removed", all=True))  # type: ignore[arg-type]


@pytest.mark.usefixtures("vhost")
def test_an_unread_index_is_said_not_taken_for_an_empty_one() -> None:
    assert ops.dead_letter_scope(SETTINGS, broker()) == (["emails.DLQ", "retired.DLQ"], "")
    unread = "the dead-letter index could not be read (the state store did not answer)"
    assert ops.dead_letter_scope(SETTINGS, broker(Index(down=True))) == (["emails.DLQ"], unread)
    with pytest.raises(ops.ForeignQueue, match="the dead-letter index could not be read"):
        ops.dead_letter_queues(SETTINGS, broker(Index(down=True)), "retired")
    # Named for reading, its .DLQ there: read whatever the index says.
    assert ops.dead_letter_queues(SETTINGS, broker(Index(down=True)), "retired", reading=True) == [
        "retired.DLQ"
    ]


def letter(dead_letter_queue: str, headers: dict[str, Any]) -> DeadLetter:
    properties = pika.BasicProperties(message_id="m1", headers=headers)
    return DeadLetter.from_delivery(dead_letter_queue, properties, b'{"not": "a message"}')


def test_only_the_environments_own_letters_may_change_in_a_queue_no_actor_declares() -> None:
    """Being in the index does not make a queue's letters the project's to retry or purge: in a
    queue no actor declares, only those stamped with this environment (its workers wrote them);
    in an actor's queue, every letter but another environment's."""
    ours = changeable(broker())
    stamped = {"x-dl-reason": "retries_exhausted", "x-dl-queue": "retired", "x-dl-environment": ""}
    assert ours(letter("retired.DLQ", stamped))
    assert ours(letter("retired.DLQ", {**stamped, "x-dl-environment": b""}))  # as pika may hand it
    assert not ours(letter("orders.DLQ", {}))  # another application's
    assert not ours(letter("orders.DLQ", {"x-death": [{"queue": "orders", "reason": "rejected"}]}))
    assert not ours(letter("retired.DLQ", {**stamped, "x-dl-environment": "staging-"}))
    assert not ours(letter("retired.DLQ", {**stamped, "x-dl-environment": 7}))  # not a stamp
    assert ours(letter("emails.DLQ", {}))  # declared: RabbitMQ's dead-lettering and old letters too
    assert not ours(letter("emails.DLQ", {**stamped, "x-dl-environment": "staging-"}))


@pytest.mark.usefixtures("vhost")
def test_a_queue_the_process_published_to_is_not_taken_for_an_actors(monkeypatch) -> None:
    """A long-lived process (the dashboard) declares every queue it publishes to: ``billing``, a
    send to another application's actor, and ``removed``, a retry of a removed actor's letter.
    Neither becomes the project's: not listed, refused when named, and their letters without the
    project's record are left by purge, retry and re-index."""
    sent = broker(sent_to=frozenset({"billing", "removed"}))
    assert ops.dead_letter_queues(SETTINGS, sent) == ["emails.DLQ", "retired.DLQ"]
    with pytest.raises(ops.ForeignQueue, match="'billing' is not a queue of the project's actors"):
        ops.dead_letter_queues(SETTINGS, sent, "billing")
    with pytest.raises(ops.ForeignQueue, match="'removed' is not a queue of the project's actors"):
        ops.dead_letter_queues(SETTINGS, sent, "removed")
    project = SimpleNamespace(settings=SETTINGS, broker=sent)
    assert dashboard_queues.work_queues(project) == ["emails", "retired"]  # type: ignore[arg-type]
    ours = changeable(sent)
    assert not ours(letter("removed.DLQ", {"x-death": [{"queue": "removed", "reason": "rejected"}]}))
    assert not ours(letter("billing.DLQ", {}))
    assert ours(
        letter(
            "removed.DLQ",
            {"x-dl-reason": "retries_exhausted", "x-dl-queue": "removed", "x-dl-environment": ""},
        )
    )


def test_health_and_migration_take_the_actors_queues_not_every_queue_published_to() -> None:
    """``jobctl health`` (and the health actor in a worker) checks, and ``migrate-queues`` recreates
    with the project's arguments, the actors' queues: a queue the process sent a message to (another
    service's actor) is declared on its broker all the same, and is none of them."""
    stub = StubBroker()
    dramatiq.actor(actor_name="send_email", queue_name="emails", broker=stub)(lambda: None)
    stub.declare_queue("billing")  # what a send to another service's actor there declares
    assert resolve_queues(SETTINGS, stub) == ["emails"]
    assert foreign_queues(stub, ["emails", "billing"]) == ["billing"]  # type: ignore[arg-type]
