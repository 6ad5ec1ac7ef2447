"""How long a delay the broker can hold, and the error of a longer one: a primitive, so that the
middleware that publishes retries can tell it from a refusal by RabbitMQ
(``jobsystem.rabbitmq.delays`` raises it) and the message-shape check knows the same reach."""

from __future__ import annotations

__all__ = ["LEVELS", "MAX_DELAY_MS", "DelayOutOfRange"]

#: Levels of the delay cascade: 2**29 - 1 s (17 years) covers every duration a setting may hold
#: (ten years); the longest level's TTL, 2**28 s, stays under RabbitMQ's ten-year TTL limit.
LEVELS = 29

#: The longest delay the cascade holds.
MAX_DELAY_MS = (2**LEVELS - 1) * 1000


class DelayOutOfRange(ValueError):
    """A delay longer than the longest the broker holds: nothing was published, and publishing
    again cannot help (the usual cause: a due time in ms since 1970 given as a delay)."""

    def __init__(self, delay_ms: float, longest_ms: int) -> None:
        super().__init__(
            f"a delay may be at most {longest_ms} ms ({longest_ms / 31_557_600_000:.0f} years), "
            f"not {delay_ms:.0f} ms: was a due time (ms since 1970) given as a delay?"
        )
