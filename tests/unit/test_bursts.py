"""What the consumer takes as one burst: the deliveries pika has buffered, up to anything else."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace
from typing import Any

from pika.adapters.blocking_connection import _ConsumerCancellationEvt, _ConsumerDeliveryEvt

from jobsystem.rabbitmq.bursts import buffered_deliveries, check_buffer_contract


def channel_holding(*events: Any) -> Any:
    return SimpleNamespace(_queue_consumer_generator=SimpleNamespace(pending_events=deque(events)))


def delivery() -> _ConsumerDeliveryEvt:
    return _ConsumerDeliveryEvt(None, None, b"{}")


def test_pikas_consume_generator_still_buffers_as_relied_on():
    assert check_buffer_contract() == []


def test_the_deliveries_buffered_ahead_of_a_cancellation_are_counted():
    assert buffered_deliveries(channel_holding(delivery(), delivery())) == 2
    cancelled = channel_holding(delivery(), _ConsumerCancellationEvt(None), delivery())
    assert buffered_deliveries(cancelled) == 1  # the generator ends at the cancellation


def test_a_channel_not_consuming_yet_has_none_buffered():
    assert buffered_deliveries(SimpleNamespace(_queue_consumer_generator=None)) == 0
    assert buffered_deliveries(channel_holding()) == 0
