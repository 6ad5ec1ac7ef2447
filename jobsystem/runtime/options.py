"""A message's option as Dramatiq resolves it: the message's own, else its actor's, else a default."""

from __future__ import annotations

from typing import Any

from dramatiq.broker import Broker
from dramatiq.errors import ActorNotFound

__all__ = ["option_of"]


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
