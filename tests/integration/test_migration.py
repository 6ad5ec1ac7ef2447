"""``jobctl migrate-queues`` against the real RabbitMQ: queues of plain Dramatiq or an older
configuration recreated without losing a message, and nothing outside the project's own queues
touched (another application's queue on the vhost, a twin it cannot use)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import dramatiq
import pika
import pytest
import requests
from dramatiq import Message
from pika.adapters.blocking_connection import BlockingChannel

from jobsystem.system import get_system
from tests import workload
from tests.jobctl_run import jobctl
from tests.queues import Queues

#: Arguments of a queue another application declared on the vhost.
THEIRS = {"x-message-ttl": 3_600_000}


def test_queues_of_plain_dramatiq_get_a_clear_error_and_a_lossless_migration(queues, prefix):
    from dramatiq.brokers.rabbitmq import RabbitmqBroker

    from jobsystem.rabbitmq.broker import QueueArgumentsMismatch
    from tests.senders import sender_broker

    queue = queues.name(workload.record)
    plain = RabbitmqBroker(url=get_system().settings.rabbitmq_url, confirm_delivery=True)
    for i in range(20):
        plain.enqueue(Message(queue_name=queue, actor_name="record", args=(f"m{i}",), kwargs={}, options={}))
    old_dead = pika.BasicProperties(delivery_mode=2)
    plain.channel.basic_publish("", f"{queue}.XQ", b'{"old": "dead letter"}', old_dead)
    plain.close()

    project = sender_broker(prefix, os.environ["STATE_URL"])
    with pytest.raises(QueueArgumentsMismatch, match="jobctl migrate-queues"):
        project.declare_queue(queue, ensure=True)

    report = jobctl(prefix, "migrate-queues", "tests.workload").stdout
    assert f"{queue}: recreated" in report and f"{queue}.XQ: 1 dead letter(s) moved" in report
    fresh = sender_broker(prefix, os.environ["STATE_URL"])
    fresh.declare_queue(queue, ensure=True)  # no 406 any more
    assert queues.depth(queue) == 20 and queues.depth(queue + ".DLQ") == 1
    bodies = sorted(json.loads(m["payload"])["args"][0] for m in queues.peek(queue, count=50))
    assert bodies == sorted(f"m{i}" for i in range(20))
    assert "every queue already has" in jobctl(prefix, "migrate-queues", "tests.workload").stdout
    # The recreated delay queue receives what leaves the delay cascade for it.
    deliver = queues.api(f"/../exchanges/%2F/{prefix}delay.deliver/bindings/source").replace(
        "/queues/%2F/..", ""
    )
    bound = {b["destination"] for b in requests.get(deliver, auth=queues.auth, timeout=10).json()}
    assert queue + ".DQ" in bound


def test_priority_queues_migrate_to_plain_ones_without_losing_a_message(queues, prefix):
    queue = queues.name(workload.record)
    for i in range(5):
        queues.send(workload.record, f"p{i}")
    assert queues.info(queue)["arguments"]["x-max-priority"] == 10

    report = jobctl(prefix, "migrate-queues", "tests.workload", RABBITMQ_MAX_PRIORITY="0").stdout
    assert f"{queue}: recreated" in report
    assert "x-max-priority" not in queues.info(queue)["arguments"]
    assert "x-max-priority" not in queues.info(queue + ".DQ")["arguments"]
    bodies = sorted(json.loads(m["payload"])["args"][0] for m in queues.peek(queue, count=10))
    assert bodies == [f"p{i}" for i in range(5)]


def test_a_message_routed_to_a_queue_while_it_is_migrated_is_not_lost(queues, prefix, monkeypatch):
    """Draining a queue then deleting it would destroy a message published in between: the delete
    is refused while the queue is not empty, and the next run finishes the move."""
    from jobsystem.ops import migration
    from jobsystem.settings import load_settings
    from jobsystem.system import build_system

    queue = queues.name(workload.record)
    for i in range(3):
        queues.send(workload.record, f"m{i}")
    system = build_system(load_settings({**os.environ, "QUEUE_PREFIX": prefix, "RABBITMQ_MAX_PRIORITY": "0"}))
    # The actor on its queue, as the application's import registers it.
    dramatiq.actor(actor_name="record", queue_name=queue, broker=system.broker)(workload.record.fn)
    move = migration._move

    def move_then_a_producer(
        channel: BlockingChannel, source: str, publish: Callable[[pika.BasicProperties, bytes], None]
    ) -> int:
        moved = move(channel, source, publish)
        if source == queue:
            queues.send(workload.record, "late")
        return moved

    monkeypatch.setattr(migration, "_move", move_then_a_producer)
    with pytest.raises(migration.MigrationError, match="nothing was lost"):
        migration.migrate(system.broker, system.settings, [queue])
    monkeypatch.undo()
    migration.migrate(system.broker, system.settings, [queue])
    assert "x-max-priority" not in queues.info(queue)["arguments"]
    bodies = sorted(json.loads(m["payload"])["args"][0] for m in queues.peek(queue, count=10))
    assert bodies == ["late", "m0", "m1", "m2"]
    system.broker.close()


def test_a_migration_stopped_after_deleting_the_queue_is_finished_by_the_next_run(queues, prefix):
    """Stopped once the queue was drained into its twin and deleted (Ctrl-C, a lost connection):
    the next run, with or without --queue, moves the messages back instead of stranding them."""
    queue = queues.name(workload.record)
    for i in range(3):
        queues.send(workload.record, f"m{i}")
    channel = queues.broker.channel
    channel.queue_declare(f"{queue}.migrating", durable=True, arguments={"x-max-priority": 10})
    for _ in range(3):  # what the interrupted run did: drained, then deleted the queue
        method, properties, body = channel.basic_get(queue)
        channel.basic_publish("", f"{queue}.migrating", body, properties)
        channel.basic_ack(method.delivery_tag)
    channel.queue_delete(queue)

    report = jobctl(prefix, "migrate-queues", "tests.workload", "--queue", queue.removeprefix(prefix)).stdout
    assert "left by an interrupted run" in report
    bodies = sorted(json.loads(m["payload"])["args"][0] for m in queues.peek(queue, count=10))
    assert bodies == ["m0", "m1", "m2"] and queues.declared(f"{queue}.migrating") is None


def test_another_applications_queue_is_left_alone_named_or_not(queues, prefix):
    """A queue that begins with ``QUEUE_PREFIX`` (with the default, empty, prefix: every queue of
    the vhost) but that no actor of the project uses keeps its arguments and messages, while the
    project's queue beside it is migrated."""
    ours, theirs = prefix + "emails", prefix + "other_app_queue"
    channel = queues.broker.channel
    channel.queue_declare(ours, durable=True)  # as plain Dramatiq declared it
    channel.queue_declare(theirs, durable=True, arguments=THEIRS)
    channel.basic_publish("", theirs, b"their message", pika.BasicProperties(delivery_mode=2))

    named = jobctl(prefix, "migrate-queues", "--queue", "other_app_queue", check=False)
    assert named.returncode == 2 and "Traceback" not in named.stderr, named.stderr
    assert (
        named.stderr
        == f"jobctl: --queue 'other_app_queue': {theirs!r} is not a queue of the project's actors\n"
    )
    report = jobctl(prefix, "migrate-queues").stdout
    assert f"{ours}: recreated" in report and theirs not in report, report
    assert queues.info(ours)["arguments"]["x-dead-letter-routing-key"] == ours
    assert queues.info(theirs)["arguments"] == THEIRS
    assert [m["payload"] for m in queues.peek(theirs)] == ["their message"]


def test_a_twin_left_with_other_arguments_is_one_line_and_moves_nothing(queues, prefix):
    """A ``.migrating`` twin declared with other arguments (an older version's, made by hand) is
    refused by RabbitMQ (406): one line naming it, the exit code of a migration error, every
    message where it was."""
    queue, twin = prefix + "emails", prefix + "emails.migrating"
    channel = queues.broker.channel
    channel.queue_declare(queue, durable=True)
    channel.queue_declare(twin, durable=True, arguments={"x-max-priority": 3})
    for name, count in ((queue, 3), (twin, 1)):
        for i in range(count):
            channel.basic_publish("", name, f"{name}-{i}".encode(), pika.BasicProperties(delivery_mode=2))

    result = jobctl(prefix, "migrate-queues", check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"jobctl: queue {twin!r} exists with other arguments"), line
    assert f"no message of {queue!r} moved" in line
    assert queues.info(queue)["arguments"] == {} and queues.depth(queue) == 3
    assert queues.info(twin)["arguments"] == {"x-max-priority": 3} and queues.depth(twin) == 1


def _interfered_run(queues: Queues, prefix: str, what: str, to_twin: bool = False) -> tuple[str, str, str]:
    """``emails`` as plain Dramatiq declares it, holding ``<queue>-0`` to ``-2``, migrated while
    ``what`` (:mod:`tests.migration_interference`) happens to it (``to_twin``: to its twin): its
    name, its twin's, and the one line the failed run printed (exit code 1, no traceback)."""
    queue, twin = prefix + "emails", prefix + "emails.migrating"
    channel = queues.broker.channel
    channel.queue_declare(queue, durable=True)
    for i in range(3):
        channel.basic_publish("", queue, f"{queue}-{i}".encode(), pika.BasicProperties(delivery_mode=2))
    interfered = {"MIGRATION_INTERFERENCE": f"{what}:{twin if to_twin else queue}"}
    result = jobctl(prefix, "migrate-queues", "tests.migration_interference", check=False, **interfered)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    (line,) = result.stderr.splitlines()
    return queue, twin, line


def _payloads(queues: Queues, queue: str) -> list[str]:
    return sorted(m["payload"] for m in queues.peek(queue, count=10))


def test_a_queue_declared_again_with_other_arguments_mid_migration_is_one_line_and_loses_nothing(
    queues, prefix
):
    """A worker of the old configuration declares the queue between its delete and its new declare:
    RabbitMQ refuses the project's arguments (406). One line naming the queue, the exit code of a
    migration error, the messages waiting in the twin; the next run (that worker gone) finishes."""
    from jobsystem.ops.migration import twins_left

    queue, twin, line = _interfered_run(queues, prefix, "redeclare")
    assert line.startswith(f"jobctl: queue {queue!r} was declared again with other arguments"), line
    assert f"its messages wait in {twin!r}" in line
    assert queues.info(queue)["arguments"] == {} and queues.depth(queue) == 0
    assert _payloads(queues, twin) == [f"{queue}-{i}" for i in range(3)]
    assert twins_left(queues.settings, [queue]) == {queue}

    report = jobctl(prefix, "migrate-queues").stdout
    assert f"{queue}: recreated with the project's arguments (0 moved out, 3 back)" in report, report
    assert queues.info(queue)["arguments"]["x-dead-letter-routing-key"] == queue
    assert _payloads(queues, queue) == [f"{queue}-{i}" for i in range(3)]
    assert queues.declared(twin) is None


def test_a_queue_deleted_while_its_messages_move_out_is_one_line_and_the_next_run_finishes(queues, prefix):
    """The queue is deleted (by hand, another run) after one of its messages moved to the twin:
    the next ``basic_get`` is a 404. One line naming the queue, the exit code of a migration error,
    the moved message kept in the twin, and the next run, naming the queue RabbitMQ no longer
    has, moves it back."""
    from jobsystem.ops.migration import twins_left

    queue, twin, line = _interfered_run(queues, prefix, "delete")
    assert line.startswith(f"jobctl: queue {queue!r} was deleted while its messages were moved"), line
    assert "the 1 moved are kept" in line
    assert queues.declared(queue) is None and _payloads(queues, twin) == [f"{queue}-0"]
    assert twins_left(queues.settings, [queue]) == {queue}

    report = jobctl(prefix, "migrate-queues", "--queue", "emails").stdout
    assert f"{queue}: 1 message(s) moved back from {twin!r}" in report, report
    assert _payloads(queues, queue) == [f"{queue}-0"] and queues.declared(twin) is None


def test_a_twin_deleted_before_messages_move_into_it_is_one_line_and_loses_nothing(queues, prefix):
    """The twin is deleted (by hand, another run) once declared, before the first message moves:
    RabbitMQ returns that publish unroutable. One line naming the twin, the exit code of a
    migration error, every message still in the queue, and the next run finishes."""
    queue, twin, line = _interfered_run(queues, prefix, "delete-declared", to_twin=True)
    assert line.startswith(f"jobctl: queue {twin!r} was deleted while messages of {queue!r} moved"), line
    assert f"those not moved wait in {queue!r}; run migrate-queues again" in line
    assert queues.declared(twin) is None and queues.info(queue)["arguments"] == {}
    assert _payloads(queues, queue) == [f"{queue}-{i}" for i in range(3)]

    report = jobctl(prefix, "migrate-queues").stdout
    assert f"{queue}: recreated with the project's arguments (3 moved out, 3 back)" in report, report
    assert _payloads(queues, queue) == [f"{queue}-{i}" for i in range(3)] and queues.declared(twin) is None


def test_a_queue_deleted_once_recreated_is_one_line_and_its_messages_wait_in_the_twin(queues, prefix):
    """The recreated queue is deleted before its messages move back from the twin: that publish
    comes back unroutable. One line naming the queue, every message still in the twin, and the next
    run, naming the queue RabbitMQ no longer has, moves them back."""
    queue, twin, line = _interfered_run(queues, prefix, "delete-declared")
    assert line.startswith(f"jobctl: queue {queue!r} was deleted while messages of {twin!r} moved"), line
    assert queues.declared(queue) is None
    assert _payloads(queues, twin) == [f"{queue}-{i}" for i in range(3)]

    report = jobctl(prefix, "migrate-queues", "--queue", "emails").stdout
    assert f"{queue}: 3 message(s) moved back from {twin!r}" in report, report
    assert _payloads(queues, queue) == [f"{queue}-{i}" for i in range(3)] and queues.declared(twin) is None


@pytest.mark.parametrize("end", ["/?vhost=x", "?", "/#x", "#"])
def test_a_management_url_with_a_query_or_fragment_is_refused_naming_the_variable(prefix, end):
    """The API's paths are added after the URL: a query string or a fragment would swallow them
    (the request went to the UI's page, read as an answer or a JSON error)."""
    result = jobctl(prefix, "ping", check=False, RABBITMQ_MANAGEMENT_URL=f"http://127.0.0.1:15672{end}")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stdout + result.stderr
    assert result.stderr.startswith("jobctl: invalid setting RABBITMQ_MANAGEMENT_URL: takes no query")
    assert "15672" not in result.stdout + result.stderr  # the value is not shown


def test_a_management_url_with_a_trailing_slash_works(queues, prefix):
    queue = prefix + "emails"
    queues.broker.channel.queue_declare(queue, durable=True)
    url = "http://127.0.0.1:15672/"
    assert "management  ok" in jobctl(prefix, "ping", RABBITMQ_MANAGEMENT_URL=url).stdout
    assert f"{queue}: recreated" in jobctl(prefix, "migrate-queues", RABBITMQ_MANAGEMENT_URL=url).stdout
