"""A health check's ``--queue`` names: this environment's queue first, the name as given when
RabbitMQ has only that (read only), and this environment's when RabbitMQ cannot be asked."""

from __future__ import annotations

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker

from jobsystem.ops import queue_names
from jobsystem.ops.queue_names import named_queues, resolve_queues
from jobsystem.settings import load_settings

SETTINGS = load_settings({"QUEUE_PREFIX": "prod."})


def vhost_with(monkeypatch: pytest.MonkeyPatch, *queues: str) -> list[list[str]]:
    """RabbitMQ as having ``queues``; returns the names each look-up asked about."""
    asked: list[list[str]] = []

    def missing(
        settings: object, names: list[str], timeout: float = 0.0, deadline: object = None
    ) -> list[str]:
        asked.append(names)
        return [name for name in names if name not in queues]

    monkeypatch.setattr(queue_names, "missing_queues", missing)
    return asked


def stub_broker() -> StubBroker:
    stub = StubBroker()
    dramatiq.actor(actor_name="send_email", queue_name="prod.emails", broker=stub)(lambda: None)
    return stub


def test_a_queue_named_whole_that_only_rabbitmq_has_whole_is_checked_as_given(monkeypatch) -> None:
    vhost_with(monkeypatch, "prod.billing_service", "prod.emails")
    found = named_queues(SETTINGS, stub_broker(), ["prod.billing_service", "emails"])
    assert found == {"prod.billing_service": "prod.billing_service", "emails": "prod.emails"}


def test_the_prefixed_queue_comes_first_when_both_exist(monkeypatch) -> None:
    vhost_with(monkeypatch, "prod.billing", "prod.prod.billing", "billing")
    assert resolve_queues(SETTINGS, stub_broker(), ["prod.billing", "billing"]) == [
        "prod.billing",
        "prod.prod.billing",
    ]


def test_an_actors_queue_named_whole_asks_rabbitmq_nothing(monkeypatch) -> None:
    asked = vhost_with(monkeypatch)
    assert named_queues(SETTINGS, stub_broker(), ["prod.emails"]) == {"prod.emails": "prod.emails"}
    assert asked == []


def test_an_unreachable_rabbitmq_leaves_this_environments_queue(monkeypatch) -> None:
    def unreachable(*args: object) -> list[str]:
        raise ConnectionError("refused")

    monkeypatch.setattr(queue_names, "missing_queues", unreachable)
    assert resolve_queues(SETTINGS, stub_broker(), ["prod.billing_service"]) == ["prod.prod.billing_service"]
