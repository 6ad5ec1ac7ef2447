"""A message's option as Dramatiq resolves it (the message's own, else its actor's, else a
default), and how long a delayed message still waits."""

from __future__ import annotations

import time
from typing import Any

from dramatiq.broker import Broker
from dramatiq.errors import ActorNotFound

__all__ = ["key_ttl_ms", "option_of", "wait_ms"]


def option_of(broker: Broker, message: Any, name: str, default: Any = None) -> Any:
    """Option ``name`` of ``message`` (set at send), else of its actor (declared), else ``default``;
    ``default`` too for a message whose actor this broker does not know."""
    value = message.options.get(name)
    if value is not None:
        return value
    try:
        return broker.get_actor(message.actor_name).options.get(name, default)
    except ActorNotFound:
        return default


def wait_ms(message: Any) -> int:
    """How long ``message`` still waits before it can run: until its ``eta``, 0 without one."""
    eta = message.options.get("eta")
    return max(0, int(eta) - int(time.time() * 1000)) if isinstance(eta, int | float) else 0


def key_ttl_ms(broker: Broker, message: Any, default: int) -> int:
    """How long the idempotency key of ``message`` stays pending from its send: its
    ``idempotency_ttl`` (``default``), counted from when it is due (a job scheduled for next
    month is still a duplicate of itself tomorrow)."""
    return int(option_of(broker, message, "idempotency_ttl", default)) + wait_ms(message)
