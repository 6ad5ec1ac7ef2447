"""The tests' raw publish (``Queues.publish_raw``, which declares nothing): a body no queue takes
fails the test where it was published, not as a timeout waiting for its outcome."""

from __future__ import annotations

import pika.exceptions
import pytest

from tests import workload


def test_a_raw_publish_to_a_queue_not_yet_declared_raises_and_to_a_declared_one_arrives(queues):
    queue = queues.name(workload.record)
    with pytest.raises(pika.exceptions.UnroutableError):
        queues.publish_raw(queues.message(workload.record, "early"))
    queues.broker.declare_queue(queue, ensure=True)
    queues.publish_raw(queues.message(workload.record, "declared"), copies=2)
    assert queues.depth(queue) == 2  # confirmed by RabbitMQ, so counted
