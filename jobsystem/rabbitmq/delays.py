"""Delays held by RabbitMQ: a cascade of queues whose message TTLs are powers of two.

Dramatiq delivers a delayed message to a worker at once and the worker holds it, unacked, until
it is due; RabbitMQ closes a channel holding a delivery past ``consumer_timeout``. A delay longer
than the horizon therefore waits inside RabbitMQ instead, in the cascade kombu (Celery 5.5's
"native delayed delivery") uses:

- levels ``n = LEVELS-1 .. 0``: a durable topic exchange ``<prefix>delay.L<n>`` and a durable
  classic queue of the same name with ``x-message-ttl = 2**n`` seconds that dead-letters into the
  exchange of level ``n-1`` (level 0: into ``<prefix>delay.deliver``);
- the routing key carries the remaining whole seconds in binary, most significant bit first, then
  the destination queue: ``b28.b27. ... .b0.<queue>.DQ``. Exchange ``L<n>`` routes a key whose bit
  ``n`` is 1 into queue ``L<n>`` (to wait ``2**n`` s) and one whose bit is 0 straight on to the
  exchange of level ``n-1``, so a message waits exactly the sum of its set bits. It is published
  to the exchange of its highest set bit;
- ``<prefix>delay.deliver`` routes ``<LEVELS stars>.<queue>.DQ`` into that delay queue, where
  the worker holds the last stretch (under two seconds) and releases it at its ``eta``.

Every name carries ``QUEUE_PREFIX``, so environments sharing a vhost stay apart and deleting one
environment's queues touches no other's. A key that the deliver exchange cannot route (its queue
was deleted meanwhile) goes to its alternate exchange and waits in ``<prefix>delay.unroutable``
rather than vanishing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from jobsystem.runtime.delay_range import LEVELS, MAX_DELAY_MS, DelayOutOfRange

__all__ = [
    "EXIT_LEAD_MS",
    "LEVELS",
    "MAX_DELAY_MS",
    "DelayCascade",
    "DelayOutOfRange",
    "bits_of",
    "cascade_seconds",
    "destination_binding",
    "is_cascade_queue",
    "level_binding",
    "routing_key",
    "seconds_of",
    "skip_binding",
]

#: How long before its eta a message leaves the cascade (at least; at most one second more):
#: the worker then holds it for this last stretch and releases it at its eta to the millisecond
#: of its one-second tick, so a message is never early and the cascade's second-granularity and
#: its few milliseconds per hop never make it late.
EXIT_LEAD_MS = 1_000


_CASCADE_QUEUE = re.compile(r".*delay\.(L\d{1,2}|unroutable)")


def is_cascade_queue(name: str) -> bool:
    """Whether ``name`` is a queue of a delay cascade (of any ``QUEUE_PREFIX``): not a work queue."""
    return bool(_CASCADE_QUEUE.fullmatch(name))


def cascade_seconds(delay_ms: float) -> int:
    """Whole seconds a message delayed ``delay_ms`` waits in the cascade (0: it need not); a
    float delay (``timedelta.total_seconds() * 1000``) is taken as Dramatiq takes it. A delay
    past ``MAX_DELAY_MS`` raises :class:`DelayOutOfRange`."""
    if delay_ms > MAX_DELAY_MS:
        raise DelayOutOfRange(delay_ms, MAX_DELAY_MS)
    return max(0, int((delay_ms - EXIT_LEAD_MS) // 1000))


def bits_of(seconds: int) -> list[int]:
    """The ``LEVELS`` bits of ``seconds``, most significant first."""
    if not 0 <= seconds < 2**LEVELS:
        raise ValueError(f"seconds must be in [0, 2**{LEVELS})")
    return [(seconds >> level) & 1 for level in range(LEVELS - 1, -1, -1)]


def routing_key(seconds: int, destination: str) -> str:
    """The routing key of a message waiting ``seconds`` in the cascade, then going to ``destination``."""
    key = ".".join(str(bit) for bit in bits_of(seconds)) + "." + destination
    if len(key.encode()) > 255:
        raise ValueError("queue name too long for a routing key of the delay cascade")
    return key


def seconds_of(key: str) -> int:
    """The seconds a routing key carries (the inverse of :func:`routing_key`)."""
    value = 0
    for bit in key.split(".")[:LEVELS]:
        value = value * 2 + int(bit)
    return value


def _bit_pattern(level: int, bit: int) -> str:
    return "*." * (LEVELS - 1 - level) + f"{bit}.#"


def level_binding(level: int) -> str:
    """The pattern that routes a key into the queue of ``level`` (its bit set)."""
    return _bit_pattern(level, 1)


def skip_binding(level: int) -> str:
    """The pattern that passes a key on to the level below (its bit clear)."""
    return _bit_pattern(level, 0)


def destination_binding(destination: str) -> str:
    """The deliver exchange's pattern for ``destination``: all the bits, then exactly its name."""
    return "*." * LEVELS + destination


@dataclass(frozen=True)
class DelayCascade:
    """The cascade's names for one ``QUEUE_PREFIX``, and how to declare and publish into it."""

    prefix: str = ""

    def level(self, level: int) -> str:
        """The exchange and the queue of ``level`` (they share the name)."""
        return f"{self.prefix}delay.L{level}"

    @property
    def entry(self) -> str:
        """The top level's exchange: any key published there finds its way down."""
        return self.level(LEVELS - 1)

    def exchange_for(self, seconds: int) -> str:
        """The exchange a message waiting ``seconds`` is published to: the level of its highest
        set bit (the levels above would only pass it on; publishing to the top and letting the
        exchange-to-exchange bindings pass it down measured four times slower)."""
        return self.level(seconds.bit_length() - 1) if seconds else self.deliver

    @property
    def deliver(self) -> str:
        return f"{self.prefix}delay.deliver"

    @property
    def unroutable(self) -> str:
        return f"{self.prefix}delay.unroutable"

    def queue_arguments(self, level: int) -> dict[str, Any]:
        """Level ``level``'s queue: TTL ``2**level`` s, dead-lettering to the level below."""
        below = self.level(level - 1) if level else self.deliver
        return {"x-message-ttl": (2**level) * 1000, "x-dead-letter-exchange": below}

    def declare(self, channel: Any) -> None:
        """Declare every exchange, queue and binding of the cascade (idempotent)."""
        channel.exchange_declare(self.unroutable, exchange_type="fanout", durable=True)
        channel.queue_declare(self.unroutable, durable=True)
        channel.queue_bind(self.unroutable, self.unroutable)
        channel.exchange_declare(
            self.deliver,
            exchange_type="topic",
            durable=True,
            arguments={"alternate-exchange": self.unroutable},
        )
        for level in range(LEVELS):
            channel.exchange_declare(self.level(level), exchange_type="topic", durable=True)
            channel.queue_declare(self.level(level), durable=True, arguments=self.queue_arguments(level))
        for level in range(LEVELS):
            channel.queue_bind(self.level(level), self.level(level), routing_key=level_binding(level))
            below = self.level(level - 1) if level else self.deliver
            channel.exchange_bind(below, self.level(level), routing_key=skip_binding(level))

    def bind(self, channel: Any, destination: str) -> None:
        """Route messages leaving the cascade for ``destination`` into that queue."""
        channel.queue_bind(destination, self.deliver, routing_key=destination_binding(destination))

    def queues(self) -> list[str]:
        """The cascade's queues, top level first."""
        return [self.level(level) for level in range(LEVELS - 1, -1, -1)]

    def exchanges(self) -> list[str]:
        """The cascade's exchanges (deleting its queues leaves them): the levels', the exit's and
        the unroutable's."""
        return [*self.queues(), self.deliver, self.unroutable]
