"""Rate limits as configured: a token bucket's rate and burst per service, parsed and checked.

``RATE_LIMITS`` (settings) and the :class:`~middleware.ratelimit.RateLimits` middleware share it, so
the settings never import a middleware.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from dramatiq.middleware import MiddlewareError

__all__ = ["Limit", "RateLimitConfigError", "parse_limit", "parse_limits"]

_UNITS = {"second": 1.0, "minute": 60.0, "hour": 3600.0}
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(second|minute|hour)\s*$")
_SERVICE = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass(frozen=True)
class Limit:
    """A bucket's limits: ``rate`` tokens per second, at most ``burst`` tokens at once."""

    rate: float
    burst: float


def parse_limit(service: str, spec: object) -> Limit:
    """``{"rate": 25 | "100/minute", "burst": 20}`` as a :class:`Limit`; ValueError names ``service``.

    ``burst`` defaults to one second's worth of tokens, and at least 1.
    """
    if not _SERVICE.match(service):
        raise ValueError(f"service name {service!r} must be letters, digits, '_', '.' or '-'")
    if isinstance(spec, Limit):
        return spec
    if not isinstance(spec, Mapping):
        raise ValueError(f"service {service!r}: must be an object with 'rate' and optional 'burst'")
    unknown = set(spec) - {"rate", "burst"}
    if unknown:
        raise ValueError(f"service {service!r}: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
    rate = _parse_rate(spec.get("rate"))
    if rate is None:
        raise ValueError(
            f"service {service!r}: rate must be a positive number (per second) or 'N/second|minute|hour'"
        )
    burst = spec.get("burst", max(1.0, rate))
    if isinstance(burst, bool) or not isinstance(burst, int | float) or not math.isfinite(burst) or burst < 1:
        raise ValueError(f"service {service!r}: burst must be a number of at least 1")
    return Limit(rate=rate, burst=float(burst))


def _parse_rate(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        rate = float(value)
    elif isinstance(value, str) and (match := _RATE.match(value)):
        rate = float(match[1]) / _UNITS[match[2]]
    else:
        return None
    return rate if math.isfinite(rate) and rate > 0 else None


def parse_limits(spec: Mapping[str, object]) -> dict[str, Limit]:
    """Every service of ``spec`` (``{"smtp": {...}, ...}``) parsed; ValueError names the first bad one."""
    if not isinstance(spec, Mapping):
        raise ValueError("must be a JSON object mapping service names to {rate, burst}")
    return {str(service): parse_limit(str(service), limit) for service, limit in spec.items()}


class RateLimitConfigError(MiddlewareError):
    """An actor names a service with no configured limit, or a cost its bucket can never hold."""
