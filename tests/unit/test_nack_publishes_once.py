"""A nack publishes its dead letter once per delivery, and only for a delivery still open on the
consumer's channel.

Dramatiq's ``post_process_message`` retries a whole nack that raised ``ConnectionClosed``: the
consumer's nack published the dead letter, then its ack found the connection lost, and the retry
published the dead letter a second time (found in review 6). A delivery no longer open on this
channel (settled, or delivered on a channel since closed) is redelivered by RabbitMQ, which then
decides again.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any
from unittest import mock

import dramatiq
import pytest
from dramatiq import worker as dramatiq_worker
from dramatiq.brokers.stub import StubBroker
from dramatiq.worker import ConsumerThread

from jobsystem.dramatiq_internals import dead_letter_reason, wants_redelivery
from middleware.dead_letters import HEADER_REASON
from tests.unit.consumer_standins import Connection, Frames, consumer_of, delivered


class DeadLetters:
    """The broker's dead-letter record and hook, as the consumer uses them."""

    def record(self, broker: Any, message: Any, exception: Any) -> dict[str, Any]:
        return {HEADER_REASON: "retries_exhausted"}

    def notify(self, broker: Any, message: Any, headers: dict[str, Any]) -> None:
        return None


def dead_lettering_consumer(connection: Connection) -> tuple[Any, mock.Mock]:
    """The project's consumer on ``connection`` and a stand-in broker; the broker's
    ``publish_dead_letter``, which notes each dead letter published."""
    published = mock.Mock()
    broker = SimpleNamespace(
        dead_letters=DeadLetters(), publish_dead_letter=published, refused_follow_ups=mock.Mock()
    )
    return consumer_of(broker, connection, Frames(on_ack=lambda: None)), published


def failed_message(broker: StubBroker) -> Any:
    @dramatiq.actor(broker=broker, queue_name="q", max_retries=0)
    def doomed() -> None: ...

    return doomed.message()


def test_a_nack_retried_after_its_connection_was_lost_publishes_one_dead_letter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dramatiq_worker, "POST_PROCESS_MESSAGE_RETRY_DELAY_SECS", 0)
    consumer, published = dead_lettering_consumer(Connection(lost=True))
    stub = StubBroker()
    proxy = delivered(consumer, failed_message(stub))
    proxy.fail()
    thread: Any = object.__new__(ConsumerThread)  # Dramatiq's own settling loop, as a worker thread runs it
    thread.broker, thread.consumer, thread.logger = stub, consumer, mock.Mock()
    thread.post_process_message(proxy)
    # RabbitMQ redelivers the original (its channel closed): that delivery decides again. The
    # retry of this one must not publish a second dead letter for the same attempt.
    assert published.call_count == 1
    assert (dead_letter_reason(proxy), wants_redelivery(proxy)) == ("retries_exhausted", False)


def test_a_nack_of_a_delivery_of_an_earlier_channel_publishes_nothing_and_is_requeued() -> None:
    """The consumer reconnected while the job ran: the delivery's tag may name another delivery
    of the new channel, and RabbitMQ redelivers this one; its hooks are told it is requeued."""
    earlier, _ = dead_lettering_consumer(Connection())
    consumer, published = dead_lettering_consumer(Connection())
    proxy = delivered(earlier, failed_message(StubBroker()))
    consumer.known_tags.add(proxy.tag)  # the new channel's delivery of the same number
    proxy.fail()
    consumer.nack(proxy)
    assert (published.call_count, wants_redelivery(proxy)) == (0, True)
    assert proxy.tag in consumer.known_tags
