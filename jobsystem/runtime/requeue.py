"""Put a message back on its queue for later, from a middleware, without spending one of its retries.

Several middleware postpone a message instead of running it: idempotency while another worker
holds the key or the store is down, rate limits while the bucket is empty, any guard that could
not decide. They all need the same thing: a copy of the message (same ``message_id``, same
``retries``, same options, so the same idempotency key) published with a delay, and the original
acked only once RabbitMQ has confirmed the copy. The broker publishes with confirms, so
:func:`requeue_later` returning True means the copy is safe; the caller then raises
``SkipMessage`` and Dramatiq acks the original.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

from dramatiq import Message
from dramatiq.broker import Broker, MessageProxy

from jobsystem.dramatiq_internals import request_redelivery
from jobsystem.privacy.outage_lines import log_outage

logger = logging.getLogger(__name__)

#: Publish attempts :func:`postpone` makes before it hands the delivery back to the consumer.
POSTPONE_ATTEMPTS = 5


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
    except Exception as exc:
        log_outage(
            logger,
            logging.WARNING,
            "requeue_failed",
            exc,
            reason=reason,
            message_id=message.message_id,
            delay_ms=int(delay_ms),
        )
        time.sleep(pause_on_failure)
        return False


def postpone(
    broker: Broker,
    message: MessageProxy,
    delay_ms: int,
    *,
    reason: str,
    options: dict[str, Any] | None = None,
    attempts: int = POSTPONE_ATTEMPTS,
) -> bool:
    """Re-enqueue ``message`` for ``delay_ms`` from a worker thread, never losing it and never raising.

    A few publish attempts; if RabbitMQ takes none of them (down, or refusing the delay queue),
    the delivery is flagged for redelivery instead, so the consumer puts the original back rather
    than acking it. Returns whether the copy was confirmed. Either way the caller skips the message.
    """
    for _ in range(attempts):
        if requeue_later(broker, message, delay_ms, reason=reason, options=options):
            return True
    request_redelivery(message)
    return False


def backoff_ms(attempts: int, base_ms: int, cap_ms: int) -> int:
    """``base_ms`` doubled for each earlier attempt plus up to 10% of jitter (so that messages
    postponed together do not all come back together), at most ``cap_ms``: how long to postpone a
    message again while a dependency (the state store) stays down."""
    delay = base_ms * 2 ** min(max(attempts, 0), 30) * (1 + random.random() / 10)
    return int(min(delay, cap_ms))


def option_count(value: object) -> int:
    """A counter read from a message option, whatever a hand-made message put there."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
