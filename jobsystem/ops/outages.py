"""What is said of a dependency that did not answer wherever it leaves the process (``jobctl``
output, alerts sent to Sentry, the dashboard's pages, JSON reports): which service, and the
class name of the error at most, never the error's own text.

That text names hosts and ports (a RabbitMQ node's URL, the state store's address, the
management API's connection pool) and may quote a server's reply: it goes to the log only,
which is scrubbed (a URL's password masked), as the callers' ``causes`` and log fields.
"""

from __future__ import annotations

from jobsystem.ops.deadline import Late

__all__ = ["reason", "unreachable"]


def reason(exc: BaseException) -> str:
    """Why, in words fit for any output: the deadline's own (:class:`Late`, "no answer within
    5 s", also when ``exc`` wraps one), else the class name of ``exc``."""
    for error in (exc, exc.__cause__):
        if isinstance(error, Late):
            return str(error)
    return type(exc).__name__


def unreachable(service: str, exc: BaseException) -> str:
    """``SERVICE unreachable (reason)``, e.g. ``state store unreachable (StoreUnavailable)``."""
    return f"{service} unreachable ({reason(exc)})"
