"""``jobctl migrate-queues`` interrupted at any point, then run again, loses no message.

RabbitMQ is replaced by a small in-memory stand-in (queues, confirms, ``if_empty`` deletes) so
every step boundary can be interrupted; the real thing is covered in
``tests/integration/test_dead_letters.py``.
"""

from __future__ import annotations

import re
from collections import deque
from types import SimpleNamespace
from typing import Any

import pika.exceptions
import pytest

from jobsystem.ops import migration
from jobsystem.settings import load_settings

PREFIX = "t1-"
QUEUE = f"{PREFIX}emails"
OLD: dict[str, Any] = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": f"{QUEUE}.XQ"}
NEW: dict[str, Any] = {"x-dead-letter-exchange": "jobs.dead-letters", "x-dead-letter-routing-key": QUEUE}


class Interrupted(Exception):
    """Ctrl-C, a lost connection: the run stops between two calls to RabbitMQ."""


class Rabbit:
    """Queues with their arguments and messages; ``calls_left`` calls before :class:`Interrupted`."""

    def __init__(self) -> None:
        self.queues: dict[str, tuple[dict[str, Any], deque[bytes]]] = {}
        self.calls_left: int | None = None
        #: Publishes before someone deletes the next one's target queue (None: nobody does).
        self.publishes_left: int | None = None
        self.deleted: str | None = None

    def _tick(self) -> None:
        if self.calls_left is not None:
            if self.calls_left == 0:
                raise Interrupted
            self.calls_left -= 1

    def existing(self) -> dict[str, migration.QueueState]:
        return {n: migration.QueueState(n, dict(a), 0) for n, (a, _) in self.queues.items()}

    def messages(self) -> list[bytes]:
        return sorted(m for _, held in self.queues.values() for m in held)


class Channel:
    """The calls :func:`migration.migrate` makes on a pika channel, each one a possible stop."""

    def __init__(self, rabbit: Rabbit) -> None:
        self.rabbit = rabbit
        self.unacked: dict[int, tuple[str, bytes]] = {}
        self.tag = 0

    def confirm_delivery(self) -> None:
        """Every publish below is confirmed when it returns."""

    def queue_declare(self, name: str, durable: bool, arguments: dict[str, Any]) -> None:
        self.rabbit._tick()
        found = self.rabbit.queues.setdefault(name, (dict(arguments), deque()))
        assert found[0] == arguments, "406 PRECONDITION_FAILED"

    def basic_get(self, name: str, auto_ack: bool) -> tuple[Any, Any, Any]:
        self.rabbit._tick()
        held = self.rabbit.queues[name][1]
        if not held:
            return None, None, None
        self.tag += 1
        self.unacked[self.tag] = (name, held.popleft())
        return type("Method", (), {"delivery_tag": self.tag})(), None, self.unacked[self.tag][1]

    def basic_publish(self, exchange: str, key: str, body: bytes, properties: Any, mandatory: bool) -> None:
        self.rabbit._tick()
        if self.rabbit.publishes_left is not None:
            if self.rabbit.publishes_left == 0:
                del self.rabbit.queues[key]  # with what it held
                self.rabbit.deleted = key
            self.rabbit.publishes_left -= 1
        if key not in self.rabbit.queues:
            raise pika.exceptions.UnroutableError([])  # returned, then confirmed
        self.rabbit.queues[key][1].append(body)

    def basic_ack(self, tag: int) -> None:
        self.rabbit._tick()
        del self.unacked[tag]

    def basic_nack(self, tag: int, requeue: bool) -> None:
        self.rabbit._tick()
        name, body = self.unacked.pop(tag)
        assert requeue
        self.rabbit.queues[name][1].appendleft(body)

    def queue_delete(self, name: str, if_empty: bool) -> None:
        self.rabbit._tick()
        if self.rabbit.queues[name][1]:
            raise pika.exceptions.ChannelClosedByBroker(406, "PRECONDITION_FAILED - queue not empty")
        del self.rabbit.queues[name]

    def requeue_unacked(self) -> None:
        """The connection closed: RabbitMQ puts back what was not acked (at the head)."""
        for name, body in reversed(list(self.unacked.values())):
            if name in self.rabbit.queues:
                self.rabbit.queues[name][1].appendleft(body)
        self.unacked.clear()


class Broker:
    """What ``migrate`` uses of :class:`~jobsystem.rabbitmq.broker.ProjectBroker`."""

    parameters = None
    dead_letter_exchange = "jobs.dead-letters"

    def __init__(self, rabbit: Rabbit) -> None:
        self.rabbit = rabbit
        #: The project's actors use one queue.
        self.actors = {"send_email": SimpleNamespace(queue_name=QUEUE)}

    def get_declared_queues(self) -> set[str]:
        """The actors' queue, and another application's, which a send to its actor declared."""
        return {QUEUE, "other_app_queue"}

    def queue_arguments(self, queue: str) -> dict[str, Any]:
        return dict(NEW)

    def declare_queue(self, queue: str, ensure: bool) -> None:
        """As the worker does at start: the work and delay queues with the project's arguments."""
        for name in (queue, f"{queue}.DQ"):
            found = self.rabbit.queues.setdefault(name, (dict(NEW), deque()))
            assert found[0] == NEW

    def bind_delays(self, queue: str) -> None:
        """Bindings only: no message moves."""


def _run(
    rabbit: Rabbit, monkeypatch: pytest.MonkeyPatch, names: list[str] | None, prefix: str = PREFIX
) -> None:
    channel = Channel(rabbit)
    connection = type("Connection", (), {"channel": lambda self: channel, "close": lambda self: None})()
    monkeypatch.setattr("jobsystem.ops.migration.pika.BlockingConnection", lambda parameters: connection)
    monkeypatch.setattr(migration, "existing_queues", lambda settings: rabbit.existing())
    try:
        migration.migrate(Broker(rabbit), load_settings({"QUEUE_PREFIX": prefix}), names)  # type: ignore[arg-type]
    finally:
        channel.requeue_unacked()


def _plain_dramatiq_queues() -> Rabbit:
    rabbit = Rabbit()
    rabbit.queues[QUEUE] = (dict(OLD), deque([b"m0", b"m1", b"m2"]))
    rabbit.queues[f"{QUEUE}.DQ"] = (dict(OLD), deque([b"d0"]))
    return rabbit


def _steps_of_a_whole_run(monkeypatch: pytest.MonkeyPatch) -> int:
    rabbit = _plain_dramatiq_queues()
    rabbit.calls_left = 10_000
    _run(rabbit, monkeypatch, None)
    return 10_000 - rabbit.calls_left


@pytest.mark.parametrize("names", [None, [QUEUE]])
def test_a_migration_interrupted_anywhere_then_run_again_loses_no_message(monkeypatch, names):
    steps = _steps_of_a_whole_run(monkeypatch)
    assert steps > 20
    for stop_after in range(steps):
        rabbit = _plain_dramatiq_queues()
        rabbit.calls_left = stop_after
        with pytest.raises(Interrupted):
            _run(rabbit, monkeypatch, names)
        rabbit.calls_left = None
        _run(rabbit, monkeypatch, names)  # the operator runs it again
        # A stop between a publish and its ack duplicates that message (documented): never a loss.
        where = {name: set(held) for name, (_, held) in rabbit.queues.items() if held}
        assert where == {QUEUE: {b"m0", b"m1", b"m2"}, f"{QUEUE}.DQ": {b"d0"}}, stop_after
        assert not [n for n in rabbit.queues if n.endswith(".migrating")], stop_after
        assert all(args == NEW for args, _ in rabbit.queues.values()), stop_after


def test_a_queue_deleted_before_a_move_publishes_into_it_is_said_and_the_next_run_finishes(monkeypatch):
    """Someone deletes the queue a move publishes into (a twin, or a queue recreated) before any
    one publish of the run: RabbitMQ returns it unroutable. The run stops, naming that queue; the
    message returned is back where it was, those moved into the queue before went with it (as the
    error says), and the next run finishes with every other message."""
    for publishes in range(8):  # 4 messages out to the twins, 4 back
        rabbit = _plain_dramatiq_queues()
        rabbit.publishes_left = publishes
        with pytest.raises(migration.MigrationError) as error:
            _run(rabbit, monkeypatch, None)
        assert str(error.value).startswith(f"queue {rabbit.deleted!r} was deleted while messages of")
        before = re.search(r"the (\d+) moved before were deleted with it", str(error.value))
        lost = int(before[1]) if before else 0
        rabbit.publishes_left = None
        _run(rabbit, monkeypatch, None)
        # Each move takes its queue's messages in order: those lost are the first ones.
        assert rabbit.messages() == sorted([b"m0", b"m1", b"m2", b"d0"][lost:]), publishes
        assert all(args == NEW for args, _ in rabbit.queues.values()), publishes
        assert not [n for n in rabbit.queues if n.endswith(".migrating")], publishes


def test_a_queue_whose_twin_still_holds_its_messages_is_migrated_even_if_a_worker_recreated_it(
    monkeypatch,
):
    """Interrupted after the delete, then a worker started: the queue is back, empty, with the
    project's arguments, and its messages wait in the twin."""
    rabbit = Rabbit()
    rabbit.queues[f"{QUEUE}.migrating"] = (dict(NEW), deque([b"m0"]))
    Broker(rabbit).declare_queue(QUEUE, ensure=True)
    _run(rabbit, monkeypatch, None)
    assert rabbit.messages() == [b"m0"] and list(rabbit.queues[QUEUE][1]) == [b"m0"]
    assert f"{QUEUE}.migrating" not in rabbit.queues


def test_with_the_default_empty_prefix_another_applications_queues_are_left_alone(monkeypatch):
    """An empty ``QUEUE_PREFIX`` matches every queue of the vhost: only the queues of the
    project's actors are migrated, not another application's (nor what looks like its twin), even
    once the command's broker declared it by a send there, and naming one is refused before
    anything changes."""
    rabbit = _plain_dramatiq_queues()
    theirs: dict[str, Any] = {"x-message-ttl": 60_000}
    rabbit.queues["other_app_queue"] = (dict(theirs), deque([b"o0"]))
    rabbit.queues["other_app_queue.migrating"] = (dict(theirs), deque([b"o1"]))
    _run(rabbit, monkeypatch, None, prefix="")
    assert rabbit.queues[QUEUE][0] == NEW and list(rabbit.queues[QUEUE][1]) == [b"m0", b"m1", b"m2"]
    assert rabbit.queues["other_app_queue"] == (theirs, deque([b"o0"]))
    assert rabbit.queues["other_app_queue.migrating"] == (theirs, deque([b"o1"]))
    with pytest.raises(
        migration.MigrationError, match=r"not a queue of the project's actors.*'other_app_queue'"
    ):
        _run(rabbit, monkeypatch, ["other_app_queue"], prefix="")
    assert rabbit.queues["other_app_queue"] == (theirs, deque([b"o0"]))
