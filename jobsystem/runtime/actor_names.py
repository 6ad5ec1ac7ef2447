"""What a message's actor name may be shown as, wherever it is logged, kept or reported.

A message's ``actor_name`` is the sender's text: for a registered actor, the actor's name; for a
message naming no registered actor, anything at all, an e-mail address or a person's name
included. So every place that shows or keeps it (lifecycle lines, job status records, Sentry
tags, metrics labels, dead letters, Dramatiq's own "undefined actor" line) shows the name only
when the broker has that actor, else :data:`UNKNOWN_ACTOR`. A place without the broker's actors
(a sender's status record, a reader of the records a worker checked, Sentry's tags) keeps a name
only when it has an actor name's shape (:data:`ACTOR_NAME_SHAPE`).

No imports from the project: middleware, observability and privacy all use it.
"""

from __future__ import annotations

import re
from collections.abc import Container
from typing import Any

from dramatiq import Broker
from dramatiq.common import q_name
from dramatiq.errors import ActorNotFound

__all__ = ["ACTOR_NAME_SHAPE", "UNKNOWN_ACTOR", "actor_label", "actor_queues", "unnamed_actor_not_found"]

#: The label of a name no registered actor has (the sender's text, which could be anything).
UNKNOWN_ACTOR = "unknown"

#: What an actor's name may look like where the registry is not at hand. Dramatiq takes any
#: ``actor_name`` (``emails.send``, ``send-email``, ``billing:charge``) and defaults to the
#: function's name (any Python identifier, non-ASCII letters included): a letter or ``_``, then
#: letters, digits, ``_ . : -``, at most 200 characters (bounded work per job, short index keys).
#: No ``@``, no space, no other punctuation: an e-mail address or "first last" is not kept. A
#: person's name written as ``Ana_Lopez`` still is: only the registry tells it apart.
ACTOR_NAME_SHAPE = re.compile(r"[^\W\d][\w.:-]{0,199}")


def actor_label(name: Any, known: Container[str] | None = None) -> str:
    """``name`` when the broker has that actor (``known``: its ``actors``; one lookup, cheap
    enough for every job), else :data:`UNKNOWN_ACTOR`. Without ``known`` (a sender of actors it
    does not import, a reader of what a worker checked) a name of :data:`ACTOR_NAME_SHAPE` is
    kept: one precompiled match on a short string."""
    if not isinstance(name, str):
        return UNKNOWN_ACTOR
    if known is not None:
        return name if name in known else UNKNOWN_ACTOR
    return name if ACTOR_NAME_SHAPE.fullmatch(name) else UNKNOWN_ACTOR


def unnamed_actor_not_found(error: ActorNotFound) -> ActorNotFound:
    """``error`` naming :data:`UNKNOWN_ACTOR` instead of the name looked up (its message, shown in
    logs, Sentry and dead letters, is that name: the sender's text), with the same traceback."""
    unnamed = ActorNotFound(UNKNOWN_ACTOR)  # type: ignore[no-untyped-call]
    unnamed.__traceback__ = error.__traceback__
    unnamed.__suppress_context__ = True
    return unnamed


def actor_queues(broker: Broker) -> set[str]:
    """The work queues (canonical names: ``<queue>.DQ`` and ``<queue>.DLQ`` derive from them) of
    the actors registered on ``broker``: the project's and those of the modules a command imported.
    Not :meth:`~dramatiq.Broker.get_declared_queues`: every publish declares its queue, so that
    also holds whatever the process sent to since it started (a replay into a removed actor's
    queue, a send to another service's actor), which is no reason to take a queue as the project's."""
    return {q_name(actor.queue_name) for actor in broker.actors.values()}
