"""The tests' raw publish (``Queues.publish_raw``, which declares nothing): a body no queue takes
fails the test where it was published, not as a timeout waiting for its outcome; and a worker the
``start_worker`` fixture returned consumes all its queues, so one published right after runs."""

from __future__ import annotations

import pika.exceptions
import pytest

from tests import workload
from tests.support import wait_for


def test_a_raw_publish_to_a_queue_not_yet_declared_raises_and_to_a_declared_one_arrives(queues):
    queue = queues.name(workload.record)
    with pytest.raises(pika.exceptions.UnroutableError):
        queues.publish_raw(queues.message(workload.record, "early"))
    queues.broker.declare_queue(queue, ensure=True)
    queues.publish_raw(queues.message(workload.record, "declared"), copies=2)
    assert queues.depth(queue) == 2  # confirmed by RabbitMQ, so counted


def test_a_started_worker_consumes_every_queue_of_its_own_so_a_raw_publish_right_after_runs(
    start_worker, queues, store, prefix
):
    """``start_worker`` returns once the worker consumes: it logs that it is ready when its
    consumer threads started, before they declared and subscribed to their queues, and a raw
    publish (which declares nothing) right after could find no queue to take it."""
    start_worker()
    consumed = queues.consumed()
    assert queues.name(workload.record) in consumed and queues.name(workload.record) + ".DQ" in consumed
    consumers = {queue: (queues.declared(queue) or (0, 0))[1] for queue in consumed}
    assert consumers == dict.fromkeys(consumed, 1)
    queues.publish_raw(queues.message(workload.record, "right-after"))
    wait_for(lambda: store.sismember(f"test:{prefix}tokens", "right-after"), what="the job's run")
