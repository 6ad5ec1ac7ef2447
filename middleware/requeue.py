"""Put a message back on its queue for later, from a middleware, without spending one of its retries.

Several middleware postpone a message instead of running it: idempotency while another worker
holds the key or the store is down, rate limits while the bucket is empty. They all need the same
thing: a copy of the message (same ``message_id``, same ``retries``, same options, so the same
idempotency key) published with a delay, and the original acked only once RabbitMQ has confirmed
the copy. The broker publishes with confirms, so :func:`requeue_later` returning True means the
copy is safe; the caller then raises ``SkipMessage`` and Dramatiq acks the original.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from dramatiq import Message
from dramatiq.broker import Broker, MessageProxy

logger = logging.getLogger(__name__)


def requeue_later(
    broker: Broker,
    message: Message[Any] | MessageProxy,
    delay_ms: int,
    *,
    reason: str,
    options: dict[str, Any] | None = None,
    pause_on_failure: float = 1.0,
) -> bool:
    """Publish a copy of ``message`` due in ``delay_ms``, with ``options`` merged into its own.

    Returns True once the broker confirmed the copy. On failure it logs ``requeue_failed`` (with
    ``reason``, the caller's name for why it postponed), sleeps ``pause_on_failure`` seconds so a
    caller that loops does not spin against a broker that is down, and returns False: the caller
    still holds the unacked original and decides whether to try again.
    """
    try:
        broker.enqueue(message.copy(options=options or {}), delay=max(0, int(delay_ms)))
        return True
    except Exception:
        logger.exception(
            "requeue_failed",
            extra={"reason": reason, "message_id": message.message_id, "delay_ms": int(delay_ms)},
        )
        time.sleep(pause_on_failure)
        return False


def requeue_until_confirmed(
    broker: Broker,
    message: Message[Any] | MessageProxy,
    delay_ms: int,
    *,
    reason: str,
    options: dict[str, Any] | None = None,
) -> None:
    """:func:`requeue_later` until the broker confirms: the worker thread holds the unacked original
    meanwhile, so nothing is lost and nothing runs early while RabbitMQ is unreachable."""
    while not requeue_later(broker, message, delay_ms, reason=reason, options=options):
        pass


def backoff_ms(attempts: int, base_ms: int, cap_ms: int) -> int:
    """``base_ms`` doubled for each earlier attempt, at most ``cap_ms``: how long to postpone a
    message again while a dependency (the state store) stays down."""
    return int(min(base_ms * 2 ** min(attempts, 30), cap_ms))
