"""Which queues the operator tools take as the project's, with the default, empty, QUEUE_PREFIX:
every queue of a shared vhost begins with it, so the prefix alone must never decide. In memory:
a real broker test with an empty prefix would act on the shared vhost."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from dashboard import dead_letters as dashboard_dead_letters
from dashboard import queues as dashboard_queues
from dashboard.dead_letters import ActionError, Selection
from jobsystem.ops import dead_letters as ops
from jobsystem.settings import load_settings
from jobsystem.store.base import StoreUnavailable

#: What RabbitMQ has on the vhost: the project's queues and another application's.
ON_THE_VHOST = ["emails", "emails.DQ", "emails.DLQ", "retired", "retired.DLQ", "billing", "billing.DLQ"]


class Index:
    """The project's dead-letter index: letters of ``retired``, an actor since removed."""

    def __init__(self, down: bool = False) -> None:
        self.down = down

    def counts(self) -> dict[str, int]:
        if self.down:
            raise StoreUnavailable("no answer")
        return {"retired": 2}


def broker(index: Index | None = None) -> Any:
    """A broker whose actors declared ``emails`` only."""
    return SimpleNamespace(
        get_declared_queues=lambda: {"emails"},
        dead_letter_index=SimpleNamespace(backend=index or Index()),
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
    # The index unanswered: the declared queues only, still never another application's.
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
