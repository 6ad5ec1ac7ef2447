"""Another application's dead letters on the vhost are never the project's: ``jobctl dlq`` and the
dashboard take only the project's queues (its actors', those its dead-letter index knows), and
in a queue no actor declares only the letters the project dead-lettered (its ``x-dl-*`` record),
whatever the index says.

Their queue is declared under the test's prefix, as every queue of the vhost begins with the
default, empty, ``QUEUE_PREFIX``; nothing outside the test's prefix is touched."""

from __future__ import annotations

import json
import time
from typing import Any

import pika
from dramatiq import Message

from jobsystem.store.dead_letter_index import DeadLetterEntry, dead_letter_index
from jobsystem.store.redis import RedisStore
from tests import workload
from tests.dashboard_server import DASHBOARD_ADMIN
from tests.jobctl_run import jobctl
from tests.queues import Queues
from tests.support import TEST_REDIS_URL, wait_for

ADMIN = ("admin", DASHBOARD_ADMIN)


def their_dead_letter(queues: Queues, prefix: str) -> str:
    """Another application's queue ``other_app`` (declared as this project declares its own: an
    application on the same library and prefix) and its ``.DLQ`` holding one message that would
    replay; returns the queue."""
    theirs = prefix + "other_app"
    queues.broker.declare_queue(theirs, ensure=True)
    body = Message(queue_name=theirs, actor_name="their_job", args=(), kwargs={}, options={}).encode()
    properties = pika.BasicProperties(delivery_mode=2, message_id="their-letter")
    queues.broker.channel.basic_publish("", theirs + ".DLQ", body, properties)
    return theirs


def our_dead_letters(queues: Queues, prefix: str, count: int, indexed: bool = True) -> list[str]:
    """``count`` dead letters of the project's ``record`` queue, indexed as a worker files them
    unless ``indexed`` is false; returns their ids."""
    queue = queues.name(workload.record)
    queues.broker.declare_queue(queue, ensure=True)
    ids, entries = [], []
    for i in range(count):
        message: Message[Any] = Message(
            queue_name=queue, actor_name="record", args=(f"r{i}",), kwargs={}, options={}
        )
        headers = {"x-dl-reason": "retries_exhausted", "x-dl-actor": "record", "x-dl-queue": queue}
        headers["x-dl-environment"] = prefix  # as this environment's workers stamp it
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


def orders_dead_letters(queues: Queues, prefix: str, count: int = 3) -> tuple[str, list[str]]:
    """Another application's ``orders`` queue, declared as it declares its own (plain queues, its
    ``.DLQ`` bound to nothing of the project's), whose ``.DLQ`` holds ``count`` dead letters of
    its own (Dramatiq messages that would replay); returns the queue and their ids."""
    orders = prefix + "orders"
    channel = queues.broker.channel
    for name in (orders, orders + ".DLQ"):
        channel.queue_declare(name, durable=True)
    ids = []
    for i in range(count):
        message: Message[Any] = Message(
            queue_name=orders, actor_name="ship_order", args=(i,), kwargs={}, options={}
        )
        properties = pika.BasicProperties(delivery_mode=2, message_id=message.message_id)
        channel.basic_publish("", orders + ".DLQ", message.encode(), properties)
        ids.append(message.message_id)
    return orders, ids


def held(queues: Queues, queue: str) -> list[str]:
    """The message ids ``queue`` holds, read message by message (and put back), not counted."""
    return sorted(m["properties"]["message_id"] for m in queues.peek(queue))


def test_another_applications_queue_named_and_reindexed_is_never_purged(start_dashboard, queues, prefix):
    """An operator names another application's ``orders`` and re-indexes it (the recovery of a
    removed actor's letters): its letters are read, but neither indexed nor purged nor retried."""
    orders, theirs = orders_dead_letters(queues, prefix)
    listed = jobctl(prefix, "dlq", "list", "--queue", "orders")  # reading a queue named: allowed
    assert sorted(line.split()[0] for line in listed.stdout.splitlines()) == sorted(theirs)

    dashboard = start_dashboard()
    reindexed = dashboard.post("/api/dead-letters/reindex", ADMIN, {"queue": "orders"})
    purged = jobctl(prefix, "dlq", "purge", "--all", "--yes", "--queue", "orders", check=False)
    by_dashboard = dashboard.post("/api/dead-letters/purge", ADMIN, {"queue": "orders", "all": True})
    jobctl(prefix, "dlq", "retry", "--all")  # the project's every dead letter: none here

    assert held(queues, orders + ".DLQ") == sorted(theirs), purged.stdout + purged.stderr
    assert held(queues, orders) == []  # nothing replayed into their work queue
    assert reindexed.status_code == 200 and reindexed.json() == {"indexed": 0, "left_out": 3}, reindexed.text
    assert purged.returncode == 2 and "Traceback" not in purged.stderr, purged.stderr
    (line,) = purged.stderr.splitlines()
    assert line.startswith(f"jobctl: --queue 'orders': {orders!r} is not a queue of the project's"), line
    assert "--module" in line
    assert by_dashboard.status_code == 400 and "not a queue of the project's" in by_dashboard.text


def test_another_applications_letters_in_the_index_are_left_by_purge_and_retry(
    start_dashboard, queues, prefix
):
    """The index holds ``orders`` (written by a re-index before that was checked, or by hand):
    purge and retry read its queue but take only letters the project dead-lettered, none there."""
    orders, theirs = orders_dead_letters(queues, prefix)
    now = int(time.time() * 1000)
    store = RedisStore(TEST_REDIS_URL, namespace=f"jobs:{prefix}")
    entries = [DeadLetterEntry(orders, i, "unknown", "rejected", "", "", "", 0, now, now) for i in theirs]
    dead_letter_index(store).add(entries, ttl_ms=None, max_length=None)
    store.client.close()
    our_dead_letters(queues, prefix, 2)

    purged = jobctl(prefix, "dlq", "purge", "--all", "--yes", "--queue", "orders", check=False)
    retried = jobctl(prefix, "dlq", "retry", "--all", check=False)
    dashboard = start_dashboard()
    by_dashboard = dashboard.post("/api/dead-letters/purge", ADMIN, {"all": True})

    assert held(queues, orders + ".DLQ") == sorted(theirs), purged.stdout + purged.stderr
    assert held(queues, orders) == []
    assert purged.returncode == 1 and purged.stdout.startswith("purged 0 dead letter(s) (3 left in "), purged
    assert f"unstamped where no actor declares {orders!r}" in purged.stdout
    assert retried.returncode == 1 and retried.stdout.startswith("retried 2 of 5 matching, 0 failed"), retried
    assert queues.depth(queues.name(workload.record)) == 2  # the project's own were replayed
    assert by_dashboard.status_code == 200 and by_dashboard.json()["left"] == 3, by_dashboard.text
    assert by_dashboard.json()["purged"] == 0


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
    assert purged.json() == {
        "purged": 1,
        "matched": 1,
        "unconfirmed": 0,
        "left": 0,
        "stopped": None,
        "notes": [],
    }
    assert queues.depth(ours + ".DLQ") == 0 and queues.depth(theirs + ".DLQ") == 1


def retired_dead_letter(queues: Queues, retired: str, *, recorded: bool) -> str:
    """A dead letter of ``retired``, an actor's queue since removed: with the record the project's
    consumer writes, stamped with the environment (``recorded``), or with RabbitMQ's ``x-death``
    only (plain Dramatiq's, moved in by ``migrate-queues``); returns its id."""
    message: Message[Any] = Message(
        queue_name=retired, actor_name="retired_job", args=(), kwargs={}, options={}
    )
    headers: dict[str, Any] = {
        "x-dl-reason": "retries_exhausted",
        "x-dl-actor": "unknown",
        "x-dl-queue": retired,
        "x-dl-environment": queues.prefix,
    }
    if not recorded:
        headers = {"x-death": [{"queue": retired, "reason": "rejected", "count": 1, "exchange": ""}]}
    properties = pika.BasicProperties(delivery_mode=2, message_id=message.message_id, headers=headers)
    queues.broker.channel.basic_publish("", retired + ".DLQ", message.encode(), properties)
    return message.message_id


def test_a_removed_actors_dead_letters_are_read_by_name_reindexed_then_purged(
    start_dashboard, queues, prefix
):
    """``retired``: no actor declares it any more, and the index never held its letters (from
    before the index, or the index lost). Named, it is read; re-indexed on the dashboard (the
    documented recovery), its letters, which carry the record the project's consumer wrote, are
    the project's and can be purged."""
    retired = prefix + "retired"
    queues.broker.declare_queue(retired, ensure=True)
    recorded = retired_dead_letter(queues, retired, recorded=True)

    listed = jobctl(prefix, "dlq", "list", "--queue", "retired")
    assert [line.split()[0] for line in listed.stdout.splitlines()] == [recorded]
    refused = jobctl(prefix, "dlq", "purge", "--all", "--yes", "--queue", "retired", check=False)
    assert refused.returncode == 2 and "not a queue of the project's" in refused.stderr, refused.stderr

    dashboard = start_dashboard()
    reindexed = dashboard.post("/api/dead-letters/reindex", ADMIN, {"queue": "retired"})
    assert reindexed.status_code == 200 and reindexed.json() == {"indexed": 1, "left_out": 0}, reindexed.text
    purged = jobctl(prefix, "dlq", "purge", "--all", "--yes", "--queue", "retired")
    assert "purged 1 dead letter(s)" in purged.stdout
    assert queues.depth(retired + ".DLQ") == 0


def test_a_removed_actors_letters_without_the_record_stay_after_the_dashboard_retried_the_others(
    start_dashboard, queues, prefix
):
    """``retired`` (no actor declares it) holds a letter the project's consumer dead-lettered and one
    without the record (plain Dramatiq's, moved in by ``migrate-queues``), which is changed only
    with a ``--module`` declaring the queue. A retry on the dashboard republishes the first, and
    its bulk send declares ``retired`` on the dashboard's broker for the rest of its life: from then
    on the dashboard takes ``retired`` as an actor's queue, and purges the other letter."""
    retired = prefix + "retired"
    queues.broker.declare_queue(retired, ensure=True)
    ours = retired_dead_letter(queues, retired, recorded=True)
    plain = retired_dead_letter(queues, retired, recorded=False)

    dashboard = start_dashboard()
    reindexed = dashboard.post("/api/dead-letters/reindex", ADMIN, {"queue": "retired"})
    assert reindexed.json() == {"indexed": 1, "left_out": 1}, reindexed.text
    retried = dashboard.post("/api/dead-letters/retry", ADMIN, {"queue": "retired", "ids": [ours]})
    assert retried.status_code == 200 and retried.json()["retried"] == 1, retried.text
    by_jobctl = jobctl(prefix, "dlq", "purge", "--all", "--yes", "--queue", "retired", check=False)
    by_dashboard = dashboard.post("/api/dead-letters/purge", ADMIN, {"queue": "retired", "all": True})

    assert by_jobctl.returncode == 2 and "not a queue of the project's" in by_jobctl.stderr, by_jobctl
    assert held(queues, retired + ".DLQ") == [plain], by_dashboard.text


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
