"""What is said of a dependency that did not answer wherever it leaves the process (``jobctl``
output, alerts sent to Sentry, the dashboard's pages, JSON reports): which service, and the
class name of the error at most, never the error's own text.

That text names hosts and ports (a RabbitMQ node's URL, the state store's address, the
management API's connection pool) and may quote a server's reply: it goes to the log only,
which is scrubbed (a URL's password masked), as the callers' ``causes`` and log fields.
"""

from __future__ import annotations

from jobsystem.ops.deadline import Late
from jobsystem.store.base import StoreMisconfigured

__all__ = ["outage_kind", "reason", "unreachable"]


def reason(exc: BaseException) -> str:
    """Why, in words fit for any output: the deadline's own (:class:`Late`, "no answer within
    5 s", also when ``exc`` wraps one), else the class name of ``exc``."""
    for error in (exc, exc.__cause__):
        if isinstance(error, Late):
            return str(error)
    return type(exc).__name__


def outage_kind(exc: BaseException) -> str:
    """``misconfigured`` for a service that answers but will never serve this configuration (a
    Redis database index it does not have, a refused login), else ``unreachable``."""
    return "misconfigured" if isinstance(exc, StoreMisconfigured) else "unreachable"


def unreachable(service: str, exc: BaseException) -> str:
    """``SERVICE unreachable (reason)``, e.g. ``state store unreachable (StoreUnavailable)``, or
    ``SERVICE misconfigured (reason)`` (:func:`outage_kind`)."""
    return f"{service} {outage_kind(exc)} ({reason(exc)})"
