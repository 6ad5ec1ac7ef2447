"""The project's own queues: those the operator tools may change or show on a shared vhost.

``QUEUE_PREFIX`` alone cannot say it: the default prefix is empty, so every queue of the vhost
begins with it, and other applications (plain Dramatiq, Celery, anything) may share the vhost
under any prefix. The project's queues are:

- the queues of the actors registered on the broker: the project's (``actors``) and those of the
  application's modules the command imported (``jobctl dlq --module``, ``jobctl dashboard
  MODULES``, as ``jobctl worker`` takes them). Never what the broker declared
  (:func:`~jobsystem.rabbitmq.broker.actor_queues`): a long-lived process declares every queue
  it publishes to, so a dashboard's retry into a removed actor's queue, or a send to another
  service's, would otherwise make that queue the project's for the rest of the process's life;
- the queues its dead-letter index holds letters of: the index lives in the project's own
  namespace of the state store and only the project's workers write it, so the dead letters of
  an actor since removed, or of an application whose modules were not given, stay reachable.

A state store that does not answer leaves the actors' queues only: nothing else is taken, and
the scope says it is incomplete (:attr:`Scope.complete`), so a command over "every dead letter"
can say so rather than report a partial answer as the whole.

A queue the operator *names* whose ``.DLQ`` exists is taken for reading and re-indexing even when
it is none of these (a removed actor's letters from before the index, an index lost): see
:func:`~jobsystem.ops.dead_letters.dead_letter_queues`. Purge and retry take only the project's
queues, and in them only the letters :func:`changeable` allows: being in the index is not enough
to be changed, since an operator may name another application's queue (``orders`` on the empty
prefix) for a re-index, and an index written before that was checked may hold its letters. A
letter may be changed when its queue is an actor's (the operator who names a ``--module`` says its
queues are the project's), or when the project's consumer dead-lettered it: its ``x-dl-*`` record
names its queue (:attr:`~jobsystem.ops.dead_letter_reader.DeadLetter.recorded`), which another
application's letters and RabbitMQ's own dead-lettering do not carry. So a removed actor's letters
stay purgeable, and another application's stay where they are, whatever the index says.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from jobsystem.ops.dead_letter_reader import DeadLetter
from jobsystem.ops.health import own_queue
from jobsystem.rabbitmq.broker import ProjectBroker, actor_queues
from jobsystem.settings import Settings
from jobsystem.store.base import StoreUnavailable

__all__ = [
    "INDEX_UNREAD",
    "ForeignQueue",
    "Scope",
    "changeable",
    "project_queue",
    "project_queues",
    "project_scope",
]

#: Said when the dead-letter index could not be read.
INDEX_UNREAD = "the dead-letter index could not be read (state store unreachable)"


class ForeignQueue(ValueError):
    """A queue named by an operator that is not one of the project's (:func:`project_queues`);
    ``index_read`` false: maybe it is, but the index that would say so did not answer."""

    def __init__(self, name: str, index_read: bool = True) -> None:
        why = "" if index_read else f" as far as is known: {INDEX_UNREAD}"
        super().__init__(f"{name!r} is not a queue of the project's actors{why}")
        self.name = name
        self.index_read = index_read


@dataclass(frozen=True)
class Scope:
    """The project's work queues, and whether the dead-letter index was read to find them."""

    queues: frozenset[str]
    complete: bool


def project_scope(broker: ProjectBroker) -> Scope:
    """The project's work queues: those of the actors registered on ``broker``, and those its
    dead-letter index holds letters of (see the module doc)."""
    own = actor_queues(broker)
    index = broker.dead_letter_index
    complete = True
    if index is not None:
        try:
            own.update(index.backend.counts())
        except StoreUnavailable:  # the actors' queues only
            complete = False
    return Scope(frozenset(own), complete)


def project_queues(broker: ProjectBroker) -> set[str]:
    """The queues of :func:`project_scope` (the actors' only when the index did not answer)."""
    return set(project_scope(broker).queues)


def project_queue(settings: Settings, broker: ProjectBroker, name: str) -> str:
    """The project's queue ``name`` (``QUEUE_PREFIX`` added unless present); raises
    :class:`ForeignQueue` when it is not one of :func:`project_queues`."""
    queue = own_queue(settings, name)
    scope = project_scope(broker)
    if queue not in scope.queues:
        raise ForeignQueue(queue, scope.complete)
    return queue


def changeable(broker: ProjectBroker) -> Callable[[DeadLetter], bool]:
    """Whether retry or purge may take a dead letter read from a project's queue: any letter of a
    queue of an actor registered on ``broker`` (the project's, the ``--module`` ones'); of a queue
    only the index knows, only one the project dead-lettered (see the module doc)."""
    actors = frozenset(actor_queues(broker))
    return lambda dead: dead.recorded or dead.queue in actors
