"""Each environment's operator tools change only its own dead letters, on a vhost it shares with
another environment of the project whose prefix extends its own (``jobs`` and ``jobs2``).

The dead-letter writer stamps its ``QUEUE_PREFIX`` on every letter (``x-dl-environment``); a
stamped letter is changed by that environment only, an unstamped one (written by the release
before the stamp) only in the ``.DLQ`` of a queue of an actor of this environment. In memory, as
``test_review_scope_faults``: a stand-in reader holds the letters; the operations run for real.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import dramatiq
import pytest
from dramatiq import Message
from dramatiq.brokers.stub import StubBroker

from dashboard import dead_letters as dashboard_dead_letters
from dashboard.dead_letters import ActionError, Selection
from jobsystem.ops import dead_letters as ops
from jobsystem.ops import queue_names
from jobsystem.ops.dead_letter_reader import DeadLetter
from jobsystem.ops.queue_names import own_queue, resolve_queues
from jobsystem.rabbitmq.broker import ProjectBroker, build_broker
from jobsystem.settings import load_settings
from tests.unit.test_dlq_replay import _dead, _Queues
from tests.unit.test_review_scope_faults import Index

SETTINGS = load_settings({"QUEUE_PREFIX": "jobs"})
#: What RabbitMQ has: ``jobs``'s ``emails`` and ``old`` (an actor since removed), ``jobs2``'s ``emails``.
ON_THE_VHOST = ["jobsemails", "jobsemails.DLQ", "jobsold.DLQ", "jobs2emails", "jobs2emails.DLQ"]


def _missing(settings: object, names: list[str], timeout: float = 0.0, deadline: object = None) -> list[str]:
    return [n for n in names if n not in ON_THE_VHOST]


@pytest.fixture(autouse=True)
def vhost(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ops, "missing_queues", _missing)
    monkeypatch.setattr(dashboard_dead_letters, "missing_queues", _missing)
    monkeypatch.setattr(queue_names, "missing_queues", _missing)


def jobs_broker(*queues: str) -> Any:
    """The broker of the environment ``jobs``: its actors use ``queues`` (default ``jobsemails``)."""
    actors = {f"a{i}": SimpleNamespace(queue_name=q) for i, q in enumerate(queues or ("jobsemails",))}
    return SimpleNamespace(
        actors=actors, dead_letter_index=SimpleNamespace(backend=Index()), environment="jobs"
    )


def letter(queue: str, stamp: str | None) -> DeadLetter:
    """A dead letter of ``queue`` as a worker of the environment ``stamp`` wrote it (None: a worker
    of the release before the stamp)."""
    message: Message[Any] = Message(queue, "send_email", (), {}, {})
    record = {"x-dl-reason": "retries_exhausted", "x-dl-queue": queue}
    if stamp is not None:
        record["x-dl-environment"] = stamp
    return _dead(f"{queue}.DLQ", message.encode(), record, message.message_id)


class Recording(ProjectBroker):
    """A broker whose channel records what it publishes (no RabbitMQ)."""

    published: list[dict[str, Any]]

    @property
    def channel(self) -> Any:
        return SimpleNamespace(basic_publish=lambda **publish: self.published.append(publish))

    def declare_queue(self, queue_name: str, *, ensure: bool = False) -> None:
        pass


def test_every_dead_letter_is_stamped_with_the_environment_that_wrote_it() -> None:
    """Whatever headers the record hands it (a malformed delivery's own included), the broker's
    publish carries its own ``QUEUE_PREFIX``; the empty prefix is a stamp too."""
    assert build_broker(load_settings({"QUEUE_PREFIX": "jobs2"}), []).environment == "jobs2"
    for environment in ("jobs2", ""):
        broker = Recording(environment=environment, url="amqp://127.0.0.1:1", middleware=[])
        broker.published = []
        headers = {"x-dl-reason": "rejected", "x-dl-environment": "jobs"}
        broker.publish_dead_letter(b"{}", headers, "m1", f"{environment}emails")
        (published,) = broker.published
        assert published["properties"].headers["x-dl-environment"] == environment
        assert published["properties"].headers["x-dl-reason"] == "rejected"


def test_a_name_that_begins_with_the_prefix_is_not_taken_for_this_environments_queue() -> None:
    """``jobs2emails`` is ``jobs2``'s queue: named to ``jobs``'s tools it is none of ``jobs``'s
    (its queue of that name would be ``jobsjobs2emails``), and a purge or retry of it is refused;
    a queue of ``jobs`` named whole or short is its own. A health check only reads: it reads
    ``jobs2emails`` as named, for RabbitMQ has it and has no ``jobsjobs2emails``."""
    stub = StubBroker()
    dramatiq.actor(actor_name="send_email", queue_name="jobsemails", broker=stub)(lambda: None)
    assert own_queue(SETTINGS, "jobs2emails", ["jobsemails"]) == "jobsjobs2emails"
    assert resolve_queues(SETTINGS, stub, ["jobs2emails"]) == ["jobs2emails"]
    assert resolve_queues(SETTINGS, stub, ["jobsemails", "emails"]) == ["jobsemails"]
    broker = jobs_broker()
    assert ops.dead_letter_queues(SETTINGS, broker, "emails") == ["jobsemails.DLQ"]
    with pytest.raises(ops.ForeignQueue, match="'jobs2emails' is not a queue"):
        ops.dead_letter_queues(SETTINGS, broker, "jobs2emails")
    project = SimpleNamespace(settings=SETTINGS, broker=broker)
    with pytest.raises(ActionError, match="'jobs2emails' is not a queue"):
        dashboard_dead_letters.purge(project, Selection(queue="jobs2emails", all=True))  # type: ignore[arg-type]


@pytest.mark.parametrize("stamp", ["jobs2", None], ids=["stamped", "previous-release"])
def test_another_environments_letters_are_read_but_never_indexed_or_changed(
    stamp: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Named for reading, ``jobs2emails.DLQ`` is read by ``jobs``'s tools (list, show, export);
    its letters are neither indexed by a re-index, nor purged, nor replayed, even when the
    operation is handed the queue."""
    broker = jobs_broker()
    theirs = letter("jobs2emails", stamp)
    made = _Queues({"jobs2emails.DLQ": [theirs]})
    monkeypatch.setattr(ops, "Reader", made.reader)
    monkeypatch.setattr(ops, "send_bulk", made.send_bulk)
    (named,) = ops.dead_letter_queues(SETTINGS, broker, "jobs2emails", reading=True)
    assert named == "jobs2emails.DLQ"
    assert [d.message_id for d in ops.read(broker, [named], ops.Filters())] == [theirs.message_id]
    assert ops.reindex(broker, named) == ops.Reindexed(0, 1)
    assert broker.dead_letter_index.backend.counts() == {}
    purged = ops.purge(broker, [named], ops.Filters())
    replayed = ops.replay(broker, [named], ops.Filters())
    assert made.acked == [] and made.published == []
    assert (purged.done, purged.left, replayed.done) == (0, {named: 1}, 0)
    assert "stamped by another environment" in purged.notes[0]


def test_letters_of_the_release_before_the_stamp_stay_changeable_in_their_actors_queue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rolling upgrade strands nothing: ``jobs``'s unstamped letters in its actor's queue are
    purged as before. In ``jobsold`` (an actor since removed, known from the index) only the
    stamped ones are: an unstamped letter there could be another environment's whose queue name
    happens to begin with ``jobs``. With the actor's module named, they are changeable too."""
    old_ours, new_ours = letter("jobsemails", None), letter("jobsemails", "jobs")
    removed_old, removed_new = letter("jobsold", None), letter("jobsold", "jobs")
    made = _Queues({"jobsemails.DLQ": [old_ours, new_ours], "jobsold.DLQ": [removed_old, removed_new]})
    monkeypatch.setattr(ops, "Reader", made.reader)
    queues = ["jobsemails.DLQ", "jobsold.DLQ"]

    outcome = ops.purge(jobs_broker(), queues, ops.Filters())
    assert made.acked == [1, 2, 2] and outcome.left == {"jobsold.DLQ": 1}
    assert "unstamped where no actor declares 'jobsold'" in outcome.notes[0]
    made.acked = []
    assert ops.purge(jobs_broker("jobsemails", "jobsold"), queues, ops.Filters()).left == {}
    assert made.acked == [1, 2, 1, 2]


def test_in_a_queue_both_environments_name_each_changes_only_its_own_stamped_letters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``jobs`` + ``2emails`` and ``jobs2`` + ``emails`` are the same queue, ``jobs2emails``: its
    letters stamped ``jobs2`` are never ``jobs``'s, though one of its actors declares the queue."""
    mine, theirs = letter("jobs2emails", "jobs"), letter("jobs2emails", "jobs2")
    made = _Queues({"jobs2emails.DLQ": [mine, theirs]})
    monkeypatch.setattr(ops, "Reader", made.reader)
    outcome = ops.purge(jobs_broker("jobs2emails"), ["jobs2emails.DLQ"], ops.Filters())
    assert made.acked == [1] and outcome.left == {"jobs2emails.DLQ": 1}
