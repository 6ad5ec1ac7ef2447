"""Bulk send: confirmed means in the queue; a nack names the messages that did not make it."""

from __future__ import annotations

import pytest

from jobsystem.rabbitmq.bulk import BulkSendError, send_bulk
from tests import workload


def test_nacked_messages_are_named(queues):
    queue = queues.name(workload.record)
    queues.broker.declare_queue(queue, ensure=True)
    messages = [queues.message(workload.record, f"c{i}") for i in range(20)]
    with queues.capped(queue, 5), pytest.raises(BulkSendError) as caught:
        send_bulk(messages, broker=queues.broker)
    error = caught.value
    assert len(error.confirmed) == 5 and len(error.failed) == 15
    assert {m.message_id for m in error.failed} == {m.message_id for m in messages[5:]}
    assert queues.depth(queue) == 5
    assert "15 of 20 messages not confirmed" in str(error)
