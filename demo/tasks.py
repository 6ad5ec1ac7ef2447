"""The demo's own actor: a job whose dependency (a partner's HTTP API) is down, then back.

It is what a failed-job workflow looks like in production: the job is retried with backoff,
dead-lettered once its retries are spent, the dependency is fixed, and the dead letters are
replayed (``jobctl dlq retry --all``) to succeed.
"""

from __future__ import annotations

import dramatiq
import requests

from jobsystem.observability.logs import get_logger
from jobsystem.system import get_system

logger = get_logger(__name__)
settings = get_system().settings


@dramatiq.actor(queue_name=settings.queue("partner"), time_limit=60_000)
def sync_orders(api_url: str, batch: int) -> int:
    """Push one batch of orders to the partner's API; returns how many it took.

    A 5xx answer raises, so the job is retried with backoff, then dead-lettered.
    """
    response = requests.post(f"{api_url}/orders", json={"batch": batch}, timeout=10)
    response.raise_for_status()
    synced = int(response.json()["synced"])
    logger.info("orders_synced", batch=batch, synced=synced)
    return synced
