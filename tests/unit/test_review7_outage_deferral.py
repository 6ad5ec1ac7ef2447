"""Review of ``Workflows.before_enqueue`` (fix/wfa): a store call on the deferral path.

A guard that cannot reach the state store defers the job (``FailClosed.defer`` ->
``postpone``): a copy re-enqueued with a delay, published to RabbitMQ alone, so the job waits out
the outage. A workflow member's copy now also needs the store (the record kept for the delay);
during that very outage the copy is refused, every deferral of every workflow member fails (each
attempt sleeping a second on the worker thread) and the delivery is only put back for redelivery.
"""

from __future__ import annotations

from typing import Any

import dramatiq
import pytest

from jobsystem.dramatiq_internals import wants_redelivery
from jobsystem.runtime.requeue import postpone
from jobsystem.store import StateStore, StoreUnavailable
from jobsystem.workflows import group
from middleware.workflows import Workflows
from tests.unit.stub import RecordingBroker, delivery
from tests.unit.workflow_brokers import TTL


@pytest.mark.xfail(
    strict=True,
    reason="a workflow member's deferral during a store outage needs the store (keep): never published",
)
def test_a_workflow_member_deferred_during_a_store_outage_is_re_enqueued(store: StateStore) -> None:
    workflows = Workflows(store, ttl_ms=TTL, cancel_ttl_ms=TTL)
    broker = RecordingBroker(middleware=[workflows])
    mail = dramatiq.actor(broker=broker, actor_name="mail", queue_name="q")(lambda to: None)
    group([mail.message("ana")], broker=broker).run()
    (member, _), *_ = broker.enqueued

    def down(*args: Any, **kwargs: Any) -> None:
        raise StoreUnavailable("redis: timeout")

    workflows.backend.keep = down  # type: ignore[method-assign]
    arrived = delivery(member)
    # What a guard whose claim found the store down does (FailClosed.defer), in one attempt.
    confirmed = postpone(broker, arrived, 5_000, reason="guard_failed", attempts=1)
    assert confirmed and not wants_redelivery(arrived), (
        "the deferral's copy was refused for the outage it defers: the delivery is put back instead"
    )
    assert len(broker.enqueued) == 2
