"""Another application's dead letters on the vhost are never the project's: ``jobctl dlq`` and the
dashboard take only the project's queues (its actors', those its dead-letter index knows).

Their queue is declared under the test's prefix, as every queue of the vhost begins with the
default, empty, ``QUEUE_PREFIX``; nothing outside the test's prefix is touched."""

from __future__ import annotations

import json
import time

import pika
from dramatiq import Message

from jobsystem.store.dead_letter_index import DeadLetterEntry, dead_letter_index
from jobsystem.store.redis import RedisStore
from tests import workload
from tests.dashboard_server import DASHBOARD_ADMIN
from tests.jobctl_run import jobctl
from tests.support import TEST_REDIS_URL, wait_for

ADMIN = ("admin", DASHBOARD_ADMIN)


def their_dead_letter(queues, prefix) -> str:
    """Another application's queue ``other_app`` (declared as this project declares its own: an
    application on the same library and prefix) and its ``.DLQ`` holding one message that would
    replay; returns the queue."""
    theirs = prefix + "other_app"
    queues.broker.declare_queue(theirs, ensure=True)
    body = Message(queue_name=theirs, actor_name="their_job", args=(), kwargs={}, options={}).encode()
    properties = pika.BasicProperties(delivery_mode=2, message_id="their-letter")
    queues.broker.channel.basic_publish("", theirs + ".DLQ", body, properties)
    return theirs


def our_dead_letters(queues, prefix, count: int, indexed: bool = True) -> list[str]:
    """``count`` dead letters of the project's ``record`` queue, indexed as a worker files them
    unless ``indexed`` is false; returns their ids."""
    queue = queues.name(workload.record)
    queues.broker.declare_queue(queue, ensure=True)
    ids, entries = [], []
    for i in range(count):
        message = Message(queue_name=queue, actor_name="record", args=(f"r{i}",), kwargs={}, options={})
        headers = {"x-dl-reason": "retries_exhausted", "x-dl-actor": "record", "x-dl-queue": queue}
        properties = pika.BasicProperties(delivery_mode=2, message_id=message.message_id, headers=headers)
        queues.broker.channel.basic_publish("", queue + ".DLQ", message.encode(), properties)
        ids.append(message.message_id)
        now = int(time.time() * 1000)
        entries.append(
            DeadLetterEntry(queue, message.message_id, "record", "retries_exhausted", "", "", "", 1, now, now)
        )
    if indexed:
        store = RedisStore(TEST_REDIS_URL, namespace=f"jobs:{prefix}")
        dead_letter_index(store).add(entries, ttl_ms=None, max_length=None)
        store.client.close()
    return ids


def test_dlq_purge_all_takes_only_the_projects_dead_letters(queues, prefix):
    theirs = their_dead_letter(queues, prefix)
    ours = queues.name(workload.record)
    our_dead_letters(queues, prefix, 2)

    purged = jobctl(prefix, "dlq", "purge", "--all", "--yes")
    assert "purged 2 dead letter(s)" in purged.stdout
    assert queues.depth(ours + ".DLQ") == 0 and queues.depth(theirs + ".DLQ") == 1

    refused = jobctl(prefix, "dlq", "purge", "--all", "--yes", "--queue", "other_app", check=False)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    (line,) = refused.stderr.splitlines()
    assert line.startswith(f"jobctl: --queue 'other_app': {theirs!r} is not a queue of the project's"), line
    assert queues.depth(theirs + ".DLQ") == 1


def test_dlq_retry_all_list_and_export_leave_another_applications_dead_letters(queues, prefix):
    theirs = their_dead_letter(queues, prefix)
    ours = queues.name(workload.record)
    our_dead_letters(queues, prefix, 2)

    retried = jobctl(prefix, "dlq", "retry", "--all")  # the index alone knows the project's queue
    assert "retried 2 of 2 matching, 0 failed" in retried.stdout
    assert queues.depth(ours) == 2 and queues.depth(ours + ".DLQ") == 0
    assert queues.depth(theirs) == 0 and queues.depth(theirs + ".DLQ") == 1

    # A dead letter the index never saw (from before it): found through the application's module.
    (unindexed,) = our_dead_letters(queues, prefix, 1, indexed=False)
    listed = jobctl(prefix, "dlq", "list", "--module", "tests.workload")
    assert [line.split()[0] for line in listed.stdout.splitlines()] == [unindexed]
    exported = jobctl(prefix, "dlq", "export", "--module", "tests.workload").stdout.splitlines()
    assert [json.loads(line)["message_id"] for line in exported] == [unindexed]


def test_the_dashboard_neither_shows_nor_acts_on_another_applications_queues(start_dashboard, queues, prefix):
    theirs = their_dead_letter(queues, prefix)
    ours = queues.name(workload.record)
    our_dead_letters(queues, prefix, 2)
    dashboard = start_dashboard()

    shown = wait_for(
        lambda: (
            (names := [q["queue"] for q in dashboard.get("/api/queues", ADMIN).json()["queues"]])
            and ours in names
            and names
        ),
        what="the overview to list the project's queue",
    )
    assert theirs not in shown
    counted = [c["queue"] for c in dashboard.get("/api/dead-letters", ADMIN).json()["queues"]]
    assert ours in counted and theirs not in counted
    named = dashboard.get("/api/dead-letters?queue=other_app", ADMIN)
    assert named.status_code == 400 and "not a queue of the project's" in named.text

    retried = dashboard.post("/api/dead-letters/retry", ADMIN, {"all": True})
    assert retried.status_code == 200 and retried.json()["retried"] == 2, retried.text
    assert queues.depth(theirs) == 0 and queues.depth(theirs + ".DLQ") == 1
    our_dead_letters(queues, prefix, 1)
    purged = dashboard.post("/api/dead-letters/purge", ADMIN, {"all": True})
    assert purged.json() == {"purged": 1, "matched": 1, "unconfirmed": 0, "notes": []}
    assert queues.depth(ours + ".DLQ") == 0 and queues.depth(theirs + ".DLQ") == 1


def test_a_removed_actors_dead_letters_are_read_by_name_reindexed_then_purged(
    start_dashboard, queues, prefix
):
    """``retired``: no actor declares it any more, and the index never held its letters (from
    before the index, or the index lost). Named, it is read; re-indexed on the dashboard (the
    documented recovery), its letters are the project's and can be purged."""
    retired = prefix + "retired"
    queues.broker.declare_queue(retired, ensure=True)
    message = Message(queue_name=retired, actor_name="retired_job", args=(), kwargs={}, options={})
    queues.broker.channel.basic_publish("", retired + ".DLQ", message.encode(), pika.BasicProperties())

    listed = jobctl(prefix, "dlq", "list", "--queue", "retired")
    assert [line.split()[0] for line in listed.stdout.splitlines()] == [message.message_id]
    refused = jobctl(prefix, "dlq", "purge", "--all", "--yes", "--queue", "retired", check=False)
    assert refused.returncode == 2 and "not a queue of the project's" in refused.stderr, refused.stderr

    dashboard = start_dashboard()
    reindexed = dashboard.post("/api/dead-letters/reindex", ADMIN, {"queue": "retired"})
    assert reindexed.status_code == 200 and reindexed.json() == {"indexed": 1}, reindexed.text
    purged = jobctl(prefix, "dlq", "purge", "--all", "--yes", "--queue", "retired")
    assert "purged 1 dead letter(s)" in purged.stdout
    assert queues.depth(retired + ".DLQ") == 0


def test_dlq_says_when_the_dead_letter_index_could_not_be_read(queues, prefix):
    our_dead_letters(queues, prefix, 1)
    down = {"STATE_URL": "redis://127.0.0.1:1/0"}  # nothing listens there
    listed = jobctl(prefix, "dlq", "list", check=False, **down)
    assert listed.returncode == 1 and "Traceback" not in listed.stderr, listed.stderr
    assert "the dead-letter index could not be read" in listed.stderr
    ours = queues.name(workload.record)
    named = jobctl(prefix, "dlq", "purge", "--all", "--yes", "--queue", ours, check=False, **down)
    assert named.returncode == 2 and "the dead-letter index could not be read" in named.stderr, named.stderr
    assert queues.depth(ours + ".DLQ") == 1
