"""The bench's scratch environment: a ``QUEUE_PREFIX`` of its own, and everything under it deleted.

Each run of the project's stack writes state: a status record per job and an idempotency key per
keyed job, kept a day (``JOB_STATUS_TTL_MS``, the keys' TTL). Under the default namespace, one
``python -m bench`` left some 300,000 keys behind in Redis, and a few sessions of benchmarking
several gigabytes. So every run of the bench takes a prefix of its own (``bench<6 hex>.``): its
state keys are ``jobs:bench<6 hex>.*``, and its queues (the project's actors' queues, declared when
``actors`` is imported, and the delay cascade) are ``bench<6 hex>.*``; all are deleted at the end.
Only such a prefix is deleted: anything else is refused.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import redis

from jobsystem.ops.migration import existing_queues
from jobsystem.store.redis import delete_matching

if TYPE_CHECKING:
    from jobsystem.rabbitmq.broker import ProjectBroker
    from jobsystem.settings import Settings

__all__ = ["delete_state", "delete_topology", "environment", "new_prefix"]

#: What a bench's prefix looks like; nothing else is deleted.
_PREFIX = re.compile(r"bench[0-9a-f]{6}\.")


def new_prefix() -> str:
    """A fresh ``QUEUE_PREFIX`` for a bench run."""
    return f"bench{uuid.uuid4().hex[:6]}."


def _check(prefix: str) -> None:
    if not _PREFIX.fullmatch(prefix):
        raise ValueError(f"refusing to delete under {prefix!r}: not a bench's prefix")


def delete_state(redis_url: str, prefix: str) -> int:
    """Delete the state keys of the environment ``prefix`` (``jobs:<prefix>*``) from the Redis at
    ``redis_url``; returns how many."""
    _check(prefix)
    client = redis.Redis.from_url(redis_url)
    try:
        return delete_matching(client, f"jobs:{prefix}*")
    finally:
        client.close()


def delete_topology(broker: ProjectBroker, settings: Settings) -> list[str]:
    """Delete every queue whose name starts with the environment's prefix (listed by the
    management API: the actors' queues, the bench's, the delay cascade's), then the cascade's
    exchanges; returns the queues' names."""
    prefix = settings.queue_prefix
    _check(prefix)
    names = sorted(name for name in existing_queues(settings) if name.startswith(prefix))
    channel, cascade = broker.channel, broker.delays
    for name in names:
        channel.queue_delete(name)
    for name in cascade.exchanges():
        channel.exchange_delete(name)
    return names


@contextmanager
def environment(redis_url: str) -> Iterator[str]:
    """Run the block under a fresh ``QUEUE_PREFIX`` (in ``os.environ``, so the settings and the
    workers started meanwhile see it); then delete its state keys from ``redis_url``. Its queues
    and exchanges are deleted by the caller, who has the broker (:func:`delete_topology`)."""
    prefix, previous = new_prefix(), os.environ.get("QUEUE_PREFIX")
    os.environ["QUEUE_PREFIX"] = prefix
    try:
        yield prefix
    finally:
        if previous is None:
            os.environ.pop("QUEUE_PREFIX", None)
        else:
            os.environ["QUEUE_PREFIX"] = previous
        delete_state(redis_url, prefix)
