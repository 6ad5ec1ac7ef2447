"""Bulk send: confirmed means in the queue; a nack names the messages that did not make it."""

from __future__ import annotations

from urllib.parse import quote

import pytest
import requests

from actors import settings
from actors.bulk import BulkSendError, send_bulk
from tests import workload


@pytest.fixture
def capped_queue(queues):
    """A RabbitMQ policy that caps the test's queue at 5 messages and nacks further publishes."""
    vhost = quote(settings.rabbitmq_vhost, safe="")
    url = f"{settings.management_url}/api/policies/{vhost}/{queues.prefix}cap"
    policy = {
        "pattern": f"^{queues.prefix}workload$",
        "definition": {"max-length": 5, "overflow": "reject-publish"},
        "apply-to": "queues",
        "priority": 10,
    }
    requests.put(url, json=policy, timeout=10).raise_for_status()
    yield queues
    requests.delete(url, timeout=10)


def test_nacked_messages_are_named(capped_queue):
    queues = capped_queue
    queue = queues.name(workload.record)
    import actors

    actors.broker.declare_queue(queue, ensure=True)
    import time

    deadline = time.monotonic() + 10  # a new policy reaches the queue within a moment
    while queues.info(queue).get("effective_policy_definition", {}).get("max-length") != 5:
        assert time.monotonic() < deadline, "policy not applied"
        time.sleep(0.1)
    messages = [queues.message(workload.record, f"c{i}") for i in range(20)]
    with pytest.raises(BulkSendError) as caught:
        send_bulk(messages)
    error = caught.value
    assert len(error.confirmed) == 5 and len(error.failed) == 15
    assert {m.message_id for m in error.failed} == {m.message_id for m in messages[5:]}
    assert queues.depth(queue) == 5
    assert "15 of 20 messages not confirmed" in str(error)


def test_empty_bulk_send_publishes_nothing():
    assert send_bulk([]) == []
