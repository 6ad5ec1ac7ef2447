"""RabbitMQ's management API as health reads it: per-queue samples (unacked messages, rates;
refreshed every 5 s by RabbitMQ) in one request, and a peek at a queue's head message for the
age of the oldest waiting message (:func:`ready_since`); and the names of the vhost's queues.
Each call's ``timeout`` bounds the whole call (:mod:`jobsystem.ops.management_http`), not each
socket operation."""

from __future__ import annotations

import json
import time
from typing import Any

from jobsystem.ops.management_http import ManagementTimeout, call_json
from jobsystem.settings import Settings

__all__ = [
    "ManagementTimeout",
    "Undated",
    "call_api",
    "oldest_age_s",
    "queue_names",
    "queue_stats",
    "rate",
    "ready_since",
]

_COLUMNS = (
    "name,type,messages_ready,messages_unacknowledged,consumers,"
    "message_stats.publish_details.rate,message_stats.ack_details.rate"
)


def call_api(config: Settings, method: str, url: str, seconds: float, **kwargs: Any) -> Any:
    """:func:`call_json` as the configured management user (``config.management_auth``): the one
    way this project calls the management API."""
    return call_json(method, url, seconds, auth=config.management_auth, **kwargs)


def queue_stats(config: Settings, timeout: float) -> dict[str, dict[str, Any]]:
    """Every queue of the vhost with the columns health needs, in one request."""
    queues = call_api(config, "GET", config.queues_api(), timeout, params={"columns": _COLUMNS})
    return {q["name"]: q for q in queues}


def queue_names(config: Settings, timeout: float) -> list[str]:
    """The names of every queue of the vhost (``requests.RequestException`` when unanswered)."""
    listed = call_api(config, "GET", config.queues_api(), timeout, params={"columns": "name"})
    return [q["name"] for q in listed]


def rate(info: dict[str, Any], name: str) -> float:
    """The rate of ``name`` (``publish``, ``ack``) in one queue's stats; 0 when not sampled yet."""
    return float(info.get("message_stats", {}).get(f"{name}_details", {}).get("rate", 0.0))


class Undated(ValueError):
    """A head message whose ready time cannot be read (not the project's nor Dramatiq's)."""


def ready_since(peeked: dict[str, Any]) -> float:
    """When a message peeked through the management API became ready in its queue (epoch s).

    The project's publishes carry that time as the AMQP ``timestamp`` property, set on every
    publish into a work queue (a delayed message and a retry are published again when due), and
    read whatever the body's size. Without it (a message of plain Dramatiq): the body's
    ``requeue_timestamp`` or ``message_timestamp``, which predate any delay or backoff.
    """
    stamp = (peeked.get("properties") or {}).get("timestamp")
    if isinstance(stamp, int) and not isinstance(stamp, bool):
        return float(stamp)
    try:
        body = json.loads(peeked["payload"])
        sent = max(int(body["message_timestamp"]), int(body.get("options", {}).get("requeue_timestamp", 0)))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise Undated("not a Dramatiq message, or cut by the truncation") from exc
    return sent / 1000


def oldest_age_s(config: Settings, queue: str, timeout: float) -> float | None:
    """Seconds since the head message of ``queue`` became ready; None when none is waiting.
    Raises Undated when its ready time cannot be read."""
    peeked = call_api(
        config,
        "POST",
        config.queues_api(queue, "get"),
        timeout,
        json={"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto", "truncate": 65_536},
    )
    if not peeked:
        return None
    return max(0.0, time.time() - ready_since(peeked[0]))
