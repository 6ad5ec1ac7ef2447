"""How many messages each worker process prefetches per queue, as a setting (``WORKER_PREFETCH``).

Dramatiq prefetches twice the worker threads per queue (or its own ``dramatiq_queue_prefetch``
variable): enough for jobs that take tens of milliseconds or more. For many jobs of a few
milliseconds, a deeper window keeps the worker threads fed while claims made at receipt are answered,
and the status, completion and ack batches full (``make bench`` and ``docs/benchmarks.md`` give the
figures). For long jobs keep it small: a busy worker holds what it prefetched, and other workers
cannot take those messages until it is done or stops.
"""

from __future__ import annotations

import dramatiq
from dramatiq.broker import Broker
from dramatiq.middleware import Middleware

__all__ = ["Prefetch"]


class Prefetch(Middleware):
    """Set the worker's prefetch per queue before its consumers start.

    Parameters:
      per_queue: messages prefetched per queue and worker process; 0 leaves Dramatiq's.
    """

    def __init__(self, per_queue: int = 0) -> None:
        if per_queue < 0:
            raise ValueError("per_queue must be at least 0")
        self.per_queue = per_queue

    def before_worker_boot(self, broker: Broker, worker: dramatiq.Worker) -> None:
        if self.per_queue:
            worker.queue_prefetch = self.per_queue
