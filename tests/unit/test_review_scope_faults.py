"""Review (faults, area 3): destructive operations stay within their own ``QUEUE_PREFIX``.

Two environments of the project share a vhost and a Redis: ``jobs`` and ``jobs2``, whose prefix
begins with the first's; or one on the default, empty, prefix and ``staging-``. Each environment's
workers dead-letter with the same ``x-dl-*`` record, naming their own queue. In memory, as
``test_queue_scope``: a stand-in reader holds the dead letters, a stand-in index remembers what
a re-index wrote, and the operations run for real.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from dramatiq import Message

from dashboard import dead_letters as dashboard_dead_letters
from dashboard.dead_letters import Selection
from jobsystem.ops import dead_letters as ops
from jobsystem.settings import load_settings
from jobsystem.store.dead_letter_index import DeadLetterEntry
from tests.unit.test_dlq_replay import _dead, _Queues

#: The vhost: the ``emails`` queue of each environment (``jobs``, ``jobs2``, ``""``, ``staging-``).
ON_THE_VHOST = [f"{p}emails{s}" for p in ("jobs", "jobs2", "", "staging-") for s in ("", ".DLQ")]


class Index:
    """This environment's dead-letter index (its own namespace of the state store)."""

    def __init__(self) -> None:
        self.entries: dict[str, list[DeadLetterEntry]] = {}

    def counts(self) -> dict[str, int]:
        return {queue: len(entries) for queue, entries in self.entries.items() if entries}

    def replace(self, queue: str, entries: list[DeadLetterEntry]) -> None:
        self.entries[queue] = list(entries)

    def remove(self, keys: list[tuple[str, str]]) -> None:
        for queue, message_id in keys:
            self.entries[queue] = [e for e in self.entries.get(queue, []) if e.message_id != message_id]


def _missing(settings: object, names: list[str], timeout: float = 0.0) -> list[str]:
    return [n for n in names if n not in ON_THE_VHOST]


@pytest.fixture
def vhost(monkeypatch: pytest.MonkeyPatch) -> None:
    """RabbitMQ as the operations ask it: the queues not on the vhost are missing."""
    monkeypatch.setattr(ops, "missing_queues", _missing)
    monkeypatch.setattr(dashboard_dead_letters, "missing_queues", _missing)


@pytest.mark.usefixtures("vhost")
@pytest.mark.parametrize(("ours", "theirs"), [("jobs", "jobs2"), ("", "staging-")])
@pytest.mark.parametrize("stamped", [True, False], ids=["stamped", "previous-release"])
def test_purge_all_never_deletes_the_dead_letters_of_an_environment_whose_prefix_extends_this_one(
    ours: str, theirs: str, stamped: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator of ``jobs`` re-indexes the queue ``jobs2emails`` named on the dashboard
    (``own_queue`` takes it as this environment's, for it starts with ``jobs``; with the empty
    prefix every name does), then purges every dead letter of the project. ``jobs2``'s letter
    carries the project's own record (its workers run the same code), so ``changeable`` takes it:
    the purge of ``jobs`` deleted ``jobs2``'s dead letter, which its operators can never replay.
    Now a letter is changed only by the environment stamped on it, and one written before the
    stamp (``previous-release``) only in a queue of an actor of this environment."""
    settings = load_settings({"QUEUE_PREFIX": ours})
    broker = SimpleNamespace(
        actors={"send_email": SimpleNamespace(queue_name=f"{ours}emails")},
        dead_letter_index=SimpleNamespace(backend=Index()),
        environment=ours,
    )
    other = f"{theirs}emails"
    message: Message[Any] = Message(other, "send_email", (), {}, {})
    record = {"x-dl-reason": "retries_exhausted", "x-dl-queue": other}  # as the other's worker wrote it
    if stamped:
        record["x-dl-environment"] = theirs
    letter = _dead(f"{other}.DLQ", message.encode(), record, message.message_id)
    made = _Queues({f"{other}.DLQ": [letter], f"{ours}emails.DLQ": []})
    monkeypatch.setattr(ops, "Reader", made.reader)
    project = SimpleNamespace(settings=settings, broker=broker)

    dashboard_dead_letters.reindex(project, other)  # type: ignore[arg-type]
    purged = dashboard_dead_letters.purge(project, Selection(queue=None, all=True))  # type: ignore[arg-type]

    assert made.acked == [], f"{ours!r} purged {theirs!r}'s dead letter: {purged}"
