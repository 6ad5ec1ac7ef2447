"""A worker consumes the queues of its own actors, not every queue its broker declares.

Dramatiq's worker adds a consumer for each queue its broker declares, at boot and after (its
``after_declare_queue`` hook), and every publish declares the queue it publishes to. So a worker
whose actor sent to another service's queue (``billing``, whose actors this worker does not have)
started consuming that queue and its ``.DQ``, and failed that service's messages as unknown
actors, to the dead letters. Dramatiq's ``--queues`` option limits the consumers to the queues
named; a worker started without it is limited here to its registered actors' queues (and their
``.DQ``), set before its consumers start. A worker started with ``--queues`` keeps its own choice.
"""

from __future__ import annotations

import dramatiq
from dramatiq.broker import Broker
from dramatiq.middleware import Middleware

from jobsystem.runtime.actor_names import actor_queues

__all__ = ["OwnQueues"]


class OwnQueues(Middleware):
    """Limit a worker's consumers to its actors' queues, unless ``--queues`` named others."""

    def before_worker_boot(self, broker: Broker, worker: dramatiq.Worker) -> None:
        if not worker.consumer_whitelist:
            worker.consumer_whitelist = actor_queues(broker)
