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
the scope says it is incomplete (:attr:`Scope.complete`) and why (:attr:`Scope.unread`: the store
did not answer, or refused this configuration), so a command over "every dead letter"
can say so rather than report a partial answer as the whole.

A queue the operator *names* is this environment's queue of that name: ``QUEUE_PREFIX`` is added
unless the name is one of the queues above, whole (:func:`~jobsystem.ops.queue_names.own_queue`), never
because it merely begins with the prefix (``jobs2emails`` is ``jobs2``'s, not ``jobs``'s; with the
empty prefix every name begins with it). For reading and re-indexing, a named queue whose
``.DLQ`` exists is taken even when it is none of these (a removed actor's letters from before the
index, an index lost): see :func:`~jobsystem.ops.dead_letters.dead_letter_queues`.

Purge and retry take only the project's queues, and in them only the letters :func:`changeable`
allows; a re-index indexes only those. Being in a queue of the scope is not enough: an index
written by an earlier release may hold another environment's or application's queue, and two
environments of one vhost run the same code, so their letters carry the same record. What tells
them apart is the environment each worker stamps on its dead letters (``x-dl-environment``: its
``QUEUE_PREFIX``, :class:`~jobsystem.rabbitmq.broker.ProjectBroker`):

- a stamped letter may be changed by the environment it names, and by no other, whatever its
  queue (``jobs`` + ``2emails`` and ``jobs2`` + ``emails`` even share ``jobs2emails``);
- a letter without the stamp (the release before it wrote none; RabbitMQ's own dead-lettering,
  Dramatiq's ``.XQ`` moved in by ``migrate-queues``, another application's) may be changed only
  in the ``.DLQ`` of a queue of an actor registered on the broker, named whole: nothing else tells
  whose it is, and a queue name that merely begins with the prefix may be another environment's.
  So a rolling upgrade strands nothing of a live actor's (the previous release's letters stay
  changeable where they are); a removed actor's unstamped letters stay read-only (list, show,
  export) unless a ``--module`` declaring its queue is named.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from jobsystem.ops.dead_letter_reader import DeadLetter
from jobsystem.ops.outages import store_failed
from jobsystem.ops.queue_names import own_queue
from jobsystem.rabbitmq.broker import ProjectBroker, actor_queues
from jobsystem.settings import Settings
from jobsystem.store.base import StoreUnavailable

__all__ = [
    "INDEX_UNREAD",
    "ForeignQueue",
    "Scope",
    "changeable",
    "index_unread",
    "project_queue",
    "project_queues",
    "project_scope",
]

#: Said when the dead-letter index could not be read, why in brackets (:func:`index_unread`).
INDEX_UNREAD = "the dead-letter index could not be read"


def index_unread(exc: BaseException) -> str:
    """:data:`INDEX_UNREAD`, and why: the store did not answer, or refused (misconfigured: which
    setting to check), as every output names it (:func:`~jobsystem.ops.outages.store_failed`)."""
    return f"{INDEX_UNREAD} ({store_failed(exc)})"


class ForeignQueue(ValueError):
    """A queue named by an operator that is not one of the project's (:func:`project_queues`);
    ``unread`` (:func:`index_unread`): maybe it is, but the index that would say so was not read."""

    def __init__(self, name: str, unread: str = "") -> None:
        why = f" as far as is known: {unread}" if unread else ""
        super().__init__(f"{name!r} is not a queue of the project's actors{why}")
        self.name = name
        self.unread = unread

    @property
    def index_read(self) -> bool:
        return not self.unread


@dataclass(frozen=True)
class Scope:
    """The project's work queues, and why the dead-letter index was not read to find them
    (:func:`index_unread`; empty when it was)."""

    queues: frozenset[str]
    unread: str = ""

    @property
    def complete(self) -> bool:
        """Whether the dead-letter index was read: the scope holds every queue it knows."""
        return not self.unread


def project_scope(broker: ProjectBroker) -> Scope:
    """The project's work queues: those of the actors registered on ``broker``, and those its
    dead-letter index holds letters of (see the module doc)."""
    own = actor_queues(broker)
    index = broker.dead_letter_index
    unread = ""
    if index is not None:
        try:
            own.update(index.backend.counts())
        except StoreUnavailable as exc:  # the actors' queues only
            unread = index_unread(exc)
    return Scope(frozenset(own), unread)


def project_queues(broker: ProjectBroker) -> set[str]:
    """The queues of :func:`project_scope` (the actors' only when the index did not answer)."""
    return set(project_scope(broker).queues)


def project_queue(settings: Settings, broker: ProjectBroker, name: str) -> str:
    """The project's queue ``name`` (:func:`~jobsystem.ops.queue_names.own_queue`: ``QUEUE_PREFIX``
    added unless ``name`` is one of :func:`project_queues` whole); raises :class:`ForeignQueue`
    when it is none of them, naming ``name`` as given when it begins with the prefix (the operator
    may have meant it whole: ``jobs2emails``, or a queue only an unread index knows)."""
    scope = project_scope(broker)
    queue = own_queue(settings, name, scope.queues)
    if queue not in scope.queues:
        raise ForeignQueue(name if name.startswith(settings.queue_prefix) else queue, scope.unread)
    return queue


def changeable(broker: ProjectBroker) -> Callable[[DeadLetter], bool]:
    """Whether retry, purge or re-index may take a dead letter read from a queue of the scope: one
    stamped with ``broker``'s environment; one without a stamp only in an actor's queue (the
    project's, the ``--module`` ones'). See the module doc."""
    actors, own = frozenset(actor_queues(broker)), broker.environment

    def ours(dead: DeadLetter) -> bool:
        if dead.environment is not None:
            return dead.environment == own
        return dead.queue in actors

    return ours
