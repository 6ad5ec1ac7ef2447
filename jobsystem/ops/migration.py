"""Recreate queues declared with other arguments (plain Dramatiq, an older configuration) in place.

RabbitMQ cannot change a queue's arguments: declaring it again with others fails with 406
PRECONDITION_FAILED. A queue is therefore migrated through a temporary twin: its messages move to
``<name>.migrating`` (declared with the new arguments), the queue is deleted and declared anew,
and the messages move back. Each move publishes with confirms and acks the source only after the
confirm, so a crash duplicates at worst and never loses. Dramatiq's old ``<queue>.XQ`` dead
letters move into the project's dead-letter exchange as they are (RabbitMQ's ``x-death`` header
still tells their origin and reason).

Run it with the workers stopped: it refuses a queue that has consumers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pika
import pika.adapters.blocking_connection
import pika.exceptions

from jobsystem.ops.management import call_api
from jobsystem.ops.queue_counts import missing_queues
from jobsystem.rabbitmq.broker import ProjectBroker, actor_queues
from jobsystem.rabbitmq.delays import is_cascade_queue
from jobsystem.runtime.connecting import open_connection
from jobsystem.settings import Settings

__all__ = [
    "TWIN_SUFFIX",
    "MigrationError",
    "QueueState",
    "existing_queues",
    "foreign_queues",
    "is_work_queue",
    "migrate",
    "work_queues",
]

#: The temporary twin ``<queue>.migrating`` a queue's messages wait in while it is recreated.
TWIN_SUFFIX = ".migrating"


class MigrationError(RuntimeError):
    """A queue could not be migrated safely (it has consumers, or the API does not answer)."""


@dataclass
class QueueState:
    name: str
    arguments: dict[str, Any]
    consumers: int


def existing_queues(settings: Settings) -> dict[str, QueueState]:
    columns = {"columns": "name,arguments,consumers"}
    found = call_api(settings, "GET", settings.queues_api(), 10, params=columns)
    return {
        q["name"]: QueueState(q["name"], q.get("arguments") or {}, int(q.get("consumers") or 0))
        for q in found
    }


def is_work_queue(settings: Settings, name: str) -> bool:
    """Whether ``name`` is a canonical queue of this environment (``QUEUE_PREFIX``): not a delay,
    dead-letter or temporary twin, nor one of the delay cascade's, whose arguments are its own."""
    suffixes = (".DQ", ".XQ", ".DLQ", TWIN_SUFFIX)
    return (
        name.startswith(settings.queue_prefix)
        and not name.endswith(suffixes)
        and "amq." not in name
        and not is_cascade_queue(name)
    )


def work_queues(settings: Settings, existing: dict[str, QueueState], own: Collection[str]) -> list[str]:
    """The queues a run without names migrates: the project's (``own``, its actors' queues) that
    are work queues (:func:`is_work_queue`) and that RabbitMQ has, or whose twin an interrupted run
    left. Never every queue with the prefix: the default, empty, ``QUEUE_PREFIX`` would take other
    applications' queues on the vhost and recreate them with the project's arguments."""
    left = {_twin_owner(name) for name in existing if name.endswith(TWIN_SUFFIX)}
    return sorted(q for q in own if is_work_queue(settings, q) and (q in existing or q in left))


def foreign_queues(broker: ProjectBroker, names: Iterable[str]) -> list[str]:
    """Those of ``names`` that are not queues of the actors registered on ``broker`` (not merely
    declared: :func:`~jobsystem.rabbitmq.broker.actor_queues`): a migration recreates them with
    the project's arguments, so only its own may be named."""
    own = actor_queues(broker)
    return [name for name in names if name not in own]


class _TargetGone(Exception):
    """A move's publish came back unroutable: its target queue is gone (deleted meanwhile)."""

    def __init__(self, target: str) -> None:
        super().__init__(target)
        self.target = target


def _publisher(
    channel: pika.adapters.blocking_connection.BlockingChannel,
    exchange: str,
    routing_key: str,
    *,
    target: str | None = None,
) -> Callable[[pika.BasicProperties, bytes], None]:
    """Publish unchanged to ``exchange``/``routing_key``, which route to the queue ``target``
    (default: ``routing_key``), the channel waiting for each confirm; RabbitMQ returning it
    unroutable raises :class:`_TargetGone`."""

    def publish(properties: pika.BasicProperties, body: bytes) -> None:
        try:
            channel.basic_publish(exchange, routing_key, body, properties, mandatory=True)
        except pika.exceptions.UnroutableError:
            raise _TargetGone(target or routing_key) from None

    return publish


@contextlib.contextmanager
def _refused(reply_code: int, said: str) -> Iterator[None]:
    """RabbitMQ's ``reply_code`` refusal of what the block asks (it closes the channel) raised as
    the one-line :class:`MigrationError` ``said``; any other refusal as it is."""
    try:
        yield
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code != reply_code:
            raise
        raise MigrationError(said) from None


def _move(
    channel: pika.adapters.blocking_connection.BlockingChannel,
    source: str,
    publish: Callable[[pika.BasicProperties, bytes], None],
) -> int:
    """Move every message of ``source`` through ``publish(properties, body)``, acking after each
    confirm. A ``source`` deleted meanwhile (404) keeps what moved where it went; a target deleted
    meanwhile (the publish returned unroutable) gets nothing more, the message back in ``source``."""
    moved = 0
    while True:
        gone = (
            f"queue {source!r} was deleted while its messages were moved (by hand, or by another "
            f"run): the {moved} moved are kept; run migrate-queues again to finish"
        )
        with _refused(404, gone):
            method, properties, body = channel.basic_get(source, auto_ack=False)
        if method is None:
            return moved
        try:
            publish(properties, body)
        except _TargetGone as exc:
            channel.basic_nack(method.delivery_tag, requeue=True)
            raise MigrationError(_target_gone(exc.target, source, moved)) from None
        channel.basic_ack(method.delivery_tag)
        moved += 1


def _target_gone(target: str, source: str, moved: int) -> str:
    """``target`` deleted while ``source``'s messages moved into it: the message it refused waits
    in ``source``; those moved before went with ``target``, deleted by whoever deleted it."""
    before = f"; the {moved} moved before were deleted with it" if moved else ""
    return (
        f"queue {target!r} was deleted while messages of {source!r} moved into it (by hand, or by "
        f"another run): those not moved wait in {source!r}{before}; run migrate-queues again to finish"
    )


def _delete_empty(
    channel: pika.adapters.blocking_connection.BlockingChannel, name: str, moved_to: str
) -> None:
    """Delete the drained queue ``name``, only if it is still empty: a producer still running, or
    the delay cascade, may have routed a message to it since (RabbitMQ refuses: nothing is lost)."""
    received = (
        f"queue {name!r} received messages while it was moved to {moved_to!r} (stop whatever "
        "publishes to it): nothing was lost; run migrate-queues again"
    )
    with _refused(406, received):
        channel.queue_delete(name, if_empty=True)


def _declare(
    channel: pika.adapters.blocking_connection.BlockingChannel, name: str, wanted: dict[str, Any], other: str
) -> None:
    """Declare ``name`` with ``wanted``. RabbitMQ refuses (406, closing the channel) a queue that
    exists with other arguments: said in the one line ``other``."""
    with _refused(406, other):
        channel.queue_declare(name, durable=True, arguments=wanted)


def _twin_taken(twin: str, name: str) -> str:
    """A twin left with other arguments (by an older version, by hand), before anything moved."""
    return (
        f"queue {twin!r} exists with other arguments than the project's (left by an older "
        f"version, or made by hand): no message of {name!r} moved; empty the twin into it or "
        "delete it, then run migrate-queues again"
    )


def _declared_again(name: str, twin: str) -> str:
    """``name`` declared with other arguments between its delete and its new declare (a worker or
    producer of the old configuration): its messages wait in the twin for the next run."""
    return (
        f"queue {name!r} was declared again with other arguments while it was migrated (a worker "
        f"or producer of the old configuration: stop it): its messages wait in {twin!r}; run "
        "migrate-queues again"
    )


def twins_left(settings: Settings, queues: list[str]) -> set[str]:
    """Those of ``queues`` whose twin an interrupted run left (none when RabbitMQ does not answer:
    the command then reports it), so that ``--queue`` may name a queue the run deleted."""
    if not queues:
        return set()
    twins = [f"{queue}{TWIN_SUFFIX}" for queue in queues]
    try:
        missing = set(missing_queues(settings, twins))
    except ConnectionError:
        return set()
    return {queue for queue, twin in zip(queues, twins, strict=True) if twin not in missing}


def _twin_owner(twin: str) -> str:
    """The work queue of ``twin`` (``<queue>.migrating`` or ``<queue>.DQ.migrating``), whose
    messages wait there until a run moves them back (the queue itself may be gone)."""
    return twin.removesuffix(TWIN_SUFFIX).removesuffix(".DQ")


def _recreate(
    channel: pika.adapters.blocking_connection.BlockingChannel,
    state: QueueState | None,
    name: str,
    wanted: dict[str, Any],
    twin_left: bool,
) -> str | None:
    """Recreate ``name`` with ``wanted`` through its twin, or finish a run interrupted half-way
    (the twin holds messages, ``name`` is gone or already recreated); what was done, if anything."""
    twin = f"{name}{TWIN_SUFFIX}"
    out = 0
    if state is not None and state.arguments != wanted:
        if state.consumers:
            raise MigrationError(f"queue {name!r} has {state.consumers} consumer(s): stop the workers first")
        _declare(channel, twin, wanted, _twin_taken(twin, name))
        out = _move(channel, name, _publisher(channel, "", twin))
        _delete_empty(channel, name, twin)
    elif not twin_left:
        return None
    _declare(channel, name, wanted, _declared_again(name, twin))
    back = _move(channel, twin, _publisher(channel, "", name))
    _delete_empty(channel, twin, name)
    if state is None or state.arguments == wanted:
        return f"{name}: {back} message(s) moved back from {twin!r}, left by an interrupted run"
    return f"{name}: recreated with the project's arguments ({out} moved out, {back} back)"


def migrate(broker: ProjectBroker, settings: Settings, names: list[str] | None = None) -> list[str]:
    """Migrate ``names`` (default: the project's queues, :func:`work_queues`); returns what was
    done. A name that is not a work queue (``delay.L3``: rebuilt as one, its messages would never
    move on) or not a queue of the project's actors is refused before anything changes. Stopped
    at any point, a second run finishes the job: no message is lost."""
    refused = [name for name in names or () if not is_work_queue(settings, name)]
    if refused:
        raise MigrationError(f"not a work queue, left as it is: {', '.join(map(repr, refused))}")
    foreign = foreign_queues(broker, names or ())
    if foreign:
        names_text = ", ".join(map(repr, foreign))
        raise MigrationError(f"not a queue of the project's actors, left as it is: {names_text}")
    existing = existing_queues(settings)
    queues = names or work_queues(settings, existing, actor_queues(broker))
    report: list[str] = []
    parameters = broker.parameters[0] if isinstance(broker.parameters, list) else broker.parameters
    connection = open_connection(parameters)  # a hung RabbitMQ: an AMQPConnectionError
    channel = connection.channel()
    channel.confirm_delivery()
    try:
        for queue in queues:
            wanted = broker.queue_arguments(queue)
            for name in (queue, f"{queue}.DQ"):
                twin_left = f"{name}{TWIN_SUFFIX}" in existing
                done = _recreate(channel, existing.get(name), name, wanted, twin_left)
                if done:
                    report.append(done)
            broker.declare_queue(queue, ensure=True)  # the exchange and the .DLQ
            broker.bind_delays(queue)  # the delay cascade's exits, lost with a recreated .DQ
            old_dead = f"{queue}.XQ"
            if old_dead in existing:
                dead = f"{queue}.DLQ"  # where the dead-letter exchange routes ``queue``
                to_dead = _publisher(channel, broker.dead_letter_exchange, queue, target=dead)
                moved = _move(channel, old_dead, to_dead)
                _delete_empty(channel, old_dead, dead)
                report.append(f"{old_dead}: {moved} dead letter(s) moved to {dead}, queue deleted")
    finally:
        connection.close()
    return report
