"""The project's own queues: those the operator tools may change or show on a shared vhost.

``QUEUE_PREFIX`` alone cannot say it: the default prefix is empty, so every queue of the vhost
begins with it, and other applications (plain Dramatiq, Celery, anything) may share the vhost
under any prefix. The project's queues are:

- the queues its actors declare: the project's (``actors``) and those of the application's
  modules the command imported (``jobctl dlq --module``, ``jobctl dashboard MODULES``, as
  ``jobctl worker`` takes them);
- the queues its dead-letter index holds letters of: the index lives in the project's own
  namespace of the state store and only the project's workers write it, so the dead letters of
  an actor since removed, or of an application whose modules were not given, stay reachable.

A state store that does not answer leaves the declared queues only: nothing else is taken.
"""

from __future__ import annotations

import contextlib

from jobsystem.ops.health import own_queue
from jobsystem.rabbitmq.broker import ProjectBroker
from jobsystem.settings import Settings
from jobsystem.store.base import StoreUnavailable

__all__ = ["ForeignQueue", "project_queue", "project_queues"]


class ForeignQueue(ValueError):
    """A queue named by an operator that is not one of the project's (:func:`project_queues`)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"{name!r} is not a queue of the project's actors")
        self.name = name


def project_queues(broker: ProjectBroker) -> set[str]:
    """The project's work queues: those its actors declared on ``broker``, and those its
    dead-letter index holds letters of (see the module doc)."""
    own = set(broker.get_declared_queues())
    index = broker.dead_letter_index
    if index is not None:
        # Unanswered: the declared queues only (the commands report the store where it matters).
        with contextlib.suppress(StoreUnavailable):
            own.update(index.backend.counts())
    return own


def project_queue(settings: Settings, broker: ProjectBroker, name: str) -> str:
    """The project's queue ``name`` (``QUEUE_PREFIX`` added unless present); raises
    :class:`ForeignQueue` when it is not one of :func:`project_queues`."""
    queue = own_queue(settings, name)
    if queue not in project_queues(broker):
        raise ForeignQueue(queue)
    return queue
