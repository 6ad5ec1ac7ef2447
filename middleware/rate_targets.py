"""Which token bucket a message spends from, and how many tokens (for :mod:`middleware.ratelimit`).

An actor's ``rate_limit`` option names a configured service (``service``) or a bucket of its own
within one (``service:key``), or is a callable of the message's arguments giving such a name; a
message may carry its own ``rate_limit`` and ``rate_limit_cost``. The ``key`` is job data (a
tenant, a recipient): it is hashed before it becomes a store key, a log field or a message option.
A name of no configured service, or a cost its bucket could never hold, makes the bucket unusable
(:class:`Unmetered`).

The target of an actor whose ``rate_limit`` is a name (not a callable) is the same for every
message without its own ``rate_limit`` or ``rate_limit_cost``: it is worked out once per actor (an
actor's options do not change once declared; an actor declared anew under the name is worked out
again).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import dramatiq
from dramatiq.broker import Broker, MessageProxy

from jobsystem.limits import Limit
from jobsystem.privacy.keyhash import KeyHasher

__all__ = ["RateTargets", "Target", "Unmetered"]


@dataclass(frozen=True)
class Target:
    """The bucket a message spends from (its store name), its service, limits and the message's cost."""

    bucket: str
    service: str
    limit: Limit
    cost: float


class Unmetered(Exception):
    """The message names a bucket that cannot be used; it is dead-lettered."""


class RateTargets:
    """The targets of messages under ``limits`` (service name -> :class:`Limit`).

    Parameters:
      limits: the configured services.
      hasher: hashes the ``key`` of a ``service:key`` bucket.
      config_name: how error messages call the configuration (e.g. the setting that holds it).
    """

    def __init__(self, limits: Mapping[str, Limit], hasher: KeyHasher, config_name: str) -> None:
        self.limits = dict(limits)
        self.hasher = hasher
        self.config_name = config_name
        # Actor name -> (actor, its target), for actors whose rate_limit is a name.
        self._static: dict[str, tuple[dramatiq.Actor[Any, Any], Target]] = {}

    def limit_of(self, bucket: str) -> Limit | None:
        """The limits of ``bucket`` (``service`` or ``service:key``), or None for an unknown service."""
        return self.limits.get(bucket.split(":", 1)[0])

    def check_cost(self, cost: object, limit: Limit) -> float:
        """``cost`` as a number of tokens; ValueError when it is not one ``limit``'s bucket can hold."""
        if isinstance(cost, bool) or not isinstance(cost, int | float) or not cost > 0:
            raise ValueError("rate_limit_cost must be a positive number")
        if cost > limit.burst:
            raise ValueError(f"rate_limit_cost {cost:g} exceeds the bucket's burst {limit.burst:g}")
        return float(cost)

    def unknown(self, actor_name: str, bucket: str) -> str:
        """The error message for an actor naming a service that is not configured."""
        known = ", ".join(sorted(self.limits)) or "none"
        return (
            f"actor {actor_name!r}: rate_limit service {bucket.split(':', 1)[0]!r} is not configured "
            f"in {self.config_name} (configured: {known})"
        )

    def of(self, broker: Broker, message: MessageProxy) -> Target | None:
        """The bucket ``message`` spends from, or None when its actor is not rate limited; raises
        :class:`Unmetered` (or what a ``rate_limit`` callable raised) when it cannot be used."""
        try:
            actor = broker.get_actor(message.actor_name)
        except dramatiq.errors.ActorNotFound:
            return None
        options = message.options
        static = options.get("rate_limit") is None and "rate_limit_cost" not in options
        if static:
            known = self._static.get(actor.actor_name)
            if known is not None and known[0] is actor:
                return known[1]
        target = self._resolve(actor, message)
        if static and target is not None and isinstance(actor.options.get("rate_limit"), str):
            self._static[actor.actor_name] = (actor, target)
        return target

    def _resolve(self, actor: dramatiq.Actor[Any, Any], message: MessageProxy) -> Target | None:
        name = message.options.get("rate_limit")
        if name is None:
            option: str | Callable[..., Any] | None = actor.options.get("rate_limit")
            name = option(*message.args, **message.kwargs) if callable(option) else option
        if name is None:
            return None
        if not isinstance(name, str) or not name:
            raise Unmetered(f"actor {actor.actor_name!r}: rate_limit gave {type(name).__name__}, not a name")
        limit = self.limit_of(name)
        if limit is None:
            raise Unmetered(self.unknown(actor.actor_name, name))
        cost = message.options.get("rate_limit_cost", actor.options.get("rate_limit_cost", 1))
        service = name.split(":", 1)[0]
        bucket = service if service == name else f"{service}:{self.hasher(name)}"
        try:
            return Target(bucket, service, limit, self.check_cost(cost, limit))
        except ValueError as exc:
            raise Unmetered(f"actor {actor.actor_name!r}: {exc}") from None
