"""The error of a delay longer than the broker can hold: a primitive, so that the middleware that
publishes retries can tell it from a refusal by RabbitMQ (``jobsystem.rabbitmq.delays`` raises it)."""

from __future__ import annotations

__all__ = ["DelayOutOfRange"]


class DelayOutOfRange(ValueError):
    """A delay longer than the longest the broker holds: nothing was published, and publishing
    again cannot help (the usual cause: a due time in ms since 1970 given as a delay)."""

    def __init__(self, delay_ms: float, longest_ms: int) -> None:
        super().__init__(
            f"a delay may be at most {longest_ms} ms ({longest_ms / 31_557_600_000:.0f} years), "
            f"not {delay_ms:.0f} ms: was a due time (ms since 1970) given as a delay?"
        )
