"""Keyed deliveries are claimed at receipt, a burst in one store call, before any is handed out.

On the real RabbitMQ and Redis: the consumer takes every delivery pika has read along with the
one it waited for, the idempotency middleware claims their keys in one store call on the
consumer's thread, and each delivery leaves the consumer with its answer on it; the rest of a
burst still in the consumer when it closes is dropped (RabbitMQ has it back, as every unacked
delivery), its claims given back, so the copies redelivered do not wait out this worker's lease.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from dramatiq.errors import ConnectionClosed

from jobsystem.rabbitmq.bursts import buffered_deliveries
from jobsystem.rabbitmq.consumer import DeadLetteringConsumer
from jobsystem.runtime.claims_ahead import Ahead
from jobsystem.store.idempotency import ClaimRequest
from middleware.idempotency import Idempotency
from tests import workload
from tests.queues import Queues
from tests.support import wait_for


@dataclass
class CountedClaims:
    """The broker's idempotency middleware, with the message ids of each burst's claims sent."""

    middleware: Idempotency
    calls: list[list[str]]


@pytest.fixture
def counted_claims(queues: Queues, monkeypatch: pytest.MonkeyPatch) -> Iterator[CountedClaims]:
    (middleware,) = [m for m in queues.broker.middleware if isinstance(m, Idempotency)]
    counted = CountedClaims(middleware, [])
    send_claims = middleware.backend.send_claims

    def counting(requests: list[ClaimRequest]) -> Any:
        counted.calls.append([r.message_id for r in requests])
        return send_claims(requests)

    monkeypatch.setattr(middleware.backend, "send_claims", counting)
    yield counted


@pytest.fixture
def consumer(queues: Queues) -> Iterator[DeadLetteringConsumer]:
    made = queues.broker.consume(queues.name(workload.effect), prefetch=8, timeout=100)
    assert isinstance(made, DeadLetteringConsumer)
    yield made
    with contextlib.suppress(ConnectionClosed):  # closed by the test already
        made.close()


def a_burst_buffered(queues: Queues, consumer: DeadLetteringConsumer, tokens: list[str]) -> list[str]:
    """Send a keyed message per token once pika has read an unkeyed one (so its consume generator
    exists), and return their ids once pika holds all of them: the next ``next()`` takes them as
    one burst."""
    plain = queues.send(workload.record, "first")
    wait_for(lambda: next(consumer) is not None, what="the unkeyed delivery")
    ids = [queues.send(workload.effect, token).message_id for token in tokens]

    def all_read() -> bool:
        consumer.connection.process_data_events(time_limit=0.05)
        return buffered_deliveries(consumer.channel) == len(tokens)

    wait_for(all_read, what="pika holding the keyed deliveries")
    assert plain.message_id not in ids
    return ids


def test_a_burst_of_keyed_deliveries_is_claimed_in_one_call_before_any_is_handed_out(
    queues: Queues, consumer: DeadLetteringConsumer, counted_claims: CountedClaims
):
    ids = a_burst_buffered(queues, consumer, ["a", "b", "c"])
    first = next(consumer)
    assert counted_claims.calls == [ids]  # one call, sent before the first was handed out
    handed_out = [first, next(consumer), next(consumer)]
    assert counted_claims.calls == [ids]  # the rest came from the burst, asking nothing more
    assert [m.message_id for m in handed_out if m is not None] == ids
    for message in handed_out:
        ahead = counted_claims.middleware.ahead.take(message)  # type: ignore[arg-type]
        assert isinstance(ahead, Ahead) and ahead.claim is not None
        assert ahead.claim.status == "claimed"


def test_the_rest_of_a_burst_dropped_at_close_has_its_claims_given_back(
    queues: Queues, consumer: DeadLetteringConsumer, counted_claims: CountedClaims
):
    """A lost connection closes the consumer with two deliveries of a burst not handed out yet:
    their claims are given back, so a copy redelivered (here, a claim by another owner) is granted
    now, not after this worker's lease."""
    queue = queues.name(workload.effect)
    ids = a_burst_buffered(queues, consumer, ["kept", "dropped-1", "dropped-2"])
    handed_out = next(consumer)
    assert handed_out is not None and handed_out.message_id == ids[0]
    consumer.close()
    middleware = counted_claims.middleware
    assert middleware.writes.flush(10)
    for token, expected in (("kept", "held"), ("dropped-1", "claimed"), ("dropped-2", "claimed")):
        key = middleware.key_of(queues.broker, workload.effect.message(token))
        assert key is not None
        (claim,) = middleware.backend.claim_many([ClaimRequest(key, "copy", "another-owner", 30_000, 60_000)])
        assert claim.status == expected, token
    wait_for(lambda: queues.depth(queue) == 4, what="every delivery back in the queue")
