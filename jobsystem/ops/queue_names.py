"""Which queue a name an operator gives means: this environment's, and for a health check also a
queue of it named whole.

``QUEUE_PREFIX`` alone cannot tell a name given whole from one given short: the default prefix
is empty, and ``jobs2emails`` begins with ``jobs`` but is ``jobs2``'s queue. So a name is taken
whole only when it is one of this environment's actor queues (:func:`own_queue`), which is what
a destructive operation must keep to (:mod:`jobsystem.ops.scope`). A health check only reads:
monitoring configured with a queue's whole name (another service's queue in this environment,
no actor of the checking process's) must go on checking it, so :func:`named_queues` takes a name
as given when RabbitMQ has it and not the prefixed form, as the dead-letter reading path does
for a named queue's ``.DLQ`` (:func:`~jobsystem.ops.dead_letters.dead_letter_scope`).
"""

from __future__ import annotations

from collections.abc import Collection

from dramatiq import Broker

from jobsystem.ops.deadline import Deadline
from jobsystem.ops.queue_counts import missing_queues
from jobsystem.rabbitmq.broker import actor_queues
from jobsystem.settings import Settings

__all__ = ["named_queues", "own_queue", "resolve_queues"]


def own_queue(settings: Settings, name: str, known: Collection[str]) -> str:
    """The queue ``name`` of this environment: ``name`` itself when it is one of ``known`` (this
    environment's own queues, prefix included), else ``QUEUE_PREFIX`` + ``name``. Never because
    it begins with the prefix: ``jobs2emails`` is another environment's (``jobs2``) queue, and
    every name begins with the default, empty, prefix."""
    return name if name in known else settings.queue(name)


def named_queues(
    settings: Settings,
    broker: Broker,
    names: Collection[str],
    timeout: float = 5.0,
    deadline: Deadline | None = None,
) -> dict[str, str]:
    """Each of ``names`` and the queue a health check reads for it: :func:`own_queue`, unless
    RabbitMQ has no such queue but has the name as given (then that, read only). Asked within
    ``timeout`` seconds (or by ``deadline``); an unreachable RabbitMQ leaves :func:`own_queue`'s
    answer, and the check reports the broker."""
    own = actor_queues(broker)
    chosen = {name: own_queue(settings, name, own) for name in names}
    whole = [name for name, queue in chosen.items() if queue != name]
    if not whole:
        return chosen
    try:
        missing = set(missing_queues(settings, [*{chosen[n] for n in whole}, *whole], timeout, deadline))
    except ConnectionError:
        return chosen
    for name in whole:
        if chosen[name] in missing and name not in missing:
            chosen[name] = name
    return chosen


def resolve_queues(
    settings: Settings,
    broker: Broker,
    names: Collection[str] | None = None,
    *,
    timeout: float = 5.0,
    deadline: Deadline | None = None,
) -> list[str]:
    """The queues a health check reads: those of ``names`` (:func:`named_queues`), else those of
    the actors registered on ``broker`` (:func:`~jobsystem.rabbitmq.broker.actor_queues`: not
    every queue the process sent to, which may be another service's)."""
    if names:
        return sorted(set(named_queues(settings, broker, names, timeout, deadline).values()))
    return sorted(actor_queues(broker))
