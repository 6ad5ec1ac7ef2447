"""Two environments of the project on one vhost and one Redis, the second's ``QUEUE_PREFIX``
extending the first's (``<prefix>`` and ``<prefix>2``): the first's operator tools never change
the second's dead letters, whatever the operator names or re-indexes; the second's change them.

The second environment's letters are published by its own broker, as its workers' consumer
publishes them (stamped with its prefix), and one as the release before the stamp wrote it. Every
queue and key is under the test's prefix."""

from __future__ import annotations

from typing import Any

import pika
from dramatiq import Message

from tests import workload
from tests.dashboard_server import DASHBOARD_ADMIN
from tests.jobctl_run import jobctl
from tests.queues import Queues
from tests.senders import publish_dead_letters, sender_broker
from tests.support import TEST_REDIS_URL, wait_for

ADMIN = ("admin", DASHBOARD_ADMIN)


def previous_release_letter(queues: Queues, queue: str) -> str:
    """A dead letter of ``queue`` with the record the release before the stamp wrote; its id."""
    message: Message[Any] = Message(queue_name=queue, actor_name="record", args=(), kwargs={}, options={})
    headers = {"x-dl-reason": "retries_exhausted", "x-dl-actor": "record", "x-dl-queue": queue}
    properties = pika.BasicProperties(delivery_mode=2, message_id=message.message_id, headers=headers)
    queues.broker.channel.basic_publish("", queue + ".DLQ", message.encode(), properties)
    return message.message_id


def held(queues: Queues, queue: str) -> list[str]:
    """The message ids ``queue`` holds, peeked, once they are all back in place (a peek's requeue
    lands a moment later, and jobctl reads only what is ready)."""
    ids = sorted(m["properties"]["message_id"] for m in queues.peek(queue))
    wait_for(lambda: queues.depth(queue) == len(ids), what="the peeked dead letters back in place")
    return ids


def test_an_environment_whose_prefix_extends_this_ones_keeps_its_dead_letters(
    start_dashboard, queues, prefix
):
    other = prefix + "2"
    theirs = other + "workload"  # the second environment's queue of the tests.workload actors
    broker = sender_broker(other, TEST_REDIS_URL)
    broker.declare_queue(theirs, ensure=True)
    dead_letter_queue = publish_dead_letters(broker, theirs, 2)  # stamped, and in its own index
    old = previous_release_letter(queues, theirs)
    letters = held(queues, dead_letter_queue)
    assert len(letters) == 3

    listed = jobctl(prefix, "dlq", "list", "--queue", theirs)  # reading a queue named: allowed
    assert sorted(line.split()[0] for line in listed.stdout.splitlines()) == letters
    dashboard = start_dashboard()
    reindexed = dashboard.post("/api/dead-letters/reindex", ADMIN, {"queue": theirs})
    by_dashboard = dashboard.post("/api/dead-letters/purge", ADMIN, {"all": True})
    retried = dashboard.post("/api/dead-letters/retry", ADMIN, {"all": True})
    named = dashboard.post("/api/dead-letters/purge", ADMIN, {"queue": theirs, "all": True})
    purged = jobctl(prefix, "dlq", "purge", "--all", "--yes")
    refused = jobctl(prefix, "dlq", "purge", "--all", "--yes", "--queue", theirs, check=False)

    assert held(queues, dead_letter_queue) == letters, (by_dashboard.text, purged.stdout)
    assert queues.depth(theirs) == 0  # nothing replayed into their work queue
    assert reindexed.status_code == 200 and reindexed.json() == {"indexed": 0, "left_out": 3}, reindexed.text
    assert by_dashboard.json()["purged"] == 0 and retried.json()["retried"] == 0
    assert named.status_code == 400 and "not a queue of the project's" in named.text
    # Named, ``theirs`` is this environment's queue of that name (the prefix added): none.
    assert refused.returncode == 2 and f"--queue {theirs!r}" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr

    # Their own tools change them: the stamped ones; the unstamped one only where an actor of
    # theirs declares its queue (their modules named).
    by_them = jobctl(other, "dlq", "purge", "--all", "--yes", check=False)
    assert by_them.returncode == 1 and by_them.stdout.startswith("purged 2 dead letter(s) (1 left in")
    assert held(queues, dead_letter_queue) == [old]
    with_module = jobctl(other, "dlq", "purge", "--all", "--yes", "--module", workload.__name__, check=False)
    assert queues.depth(dead_letter_queue) == 0, with_module.stdout + with_module.stderr
