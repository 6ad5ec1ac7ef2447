"""What is said of a dependency that failed wherever it leaves the process (``jobctl`` output,
alerts sent to Sentry, the dashboard's pages, JSON reports): which service, whether it answered
(:func:`outage_kind`), the class name of the error at most (and a Redis reply's code), never the
error's own text; for a store that refused this configuration, which setting to check, by name.

That text names hosts and ports (a RabbitMQ node's URL, the state store's address, the
management API's connection pool) and may quote a server's reply: it goes to the log only,
which is scrubbed (a URL's password masked), as the callers' ``causes`` and log fields.
"""

from __future__ import annotations

from jobsystem.ops.deadline import Late
from jobsystem.privacy.outage_lines import failure_fields
from jobsystem.store.failures import answered, misconfigured

__all__ = [
    "MISCONFIGURED",
    "STORE",
    "STORE_SETTING",
    "cause",
    "outage_kind",
    "reason",
    "store_failed",
    "store_outage",
    "unreachable",
]

#: The kind of outage of a service that answered but will never serve this configuration.
MISCONFIGURED = "misconfigured"
#: How every output names the state store, and the setting that says where it is and how to log in.
STORE, STORE_SETTING = "state store", "STATE_URL"
#: The Redis reply of a server that refuses writes until it can save its snapshot again.
_SNAPSHOT_REFUSED = "MISCONF"


def reason(exc: BaseException) -> str:
    """Why, in words fit for any output: the deadline's own (:class:`Late`, "no answer within
    5 s", also when ``exc`` wraps one), else the class name of ``exc``."""
    for error in (exc, exc.__cause__):
        if isinstance(error, Late):
            return str(error)
    return type(exc).__name__


def cause(exc: BaseException) -> str:
    """:func:`reason`, but a store error named by what it wraps: its class and a Redis reply's
    code (``AuthenticationError``, ``ResponseError MISCONF``), never a text; the store error's
    own class when it wraps nothing."""
    if reason(exc) != type(exc).__name__:
        return reason(exc)
    fields = failure_fields(exc)
    return " ".join(filter(None, [fields.get("cause"), fields.get("code")])) or fields["error"]


def outage_kind(exc: BaseException) -> str:
    """:data:`MISCONFIGURED` for a service that answers but will never serve this configuration
    (a refused login or ACL, a Redis database index it does not have, a SQLite folder that cannot
    be made, a Redis that cannot save its snapshot: ``MISCONF``); ``refused the request`` for
    another answer (an error reply such as ``OOM`` or ``READONLY``, a locked SQLite file);
    ``unreachable`` only when nothing answered (refused or lost connections, time-outs)."""
    if misconfigured(exc) or failure_fields(exc).get("code") == _SNAPSHOT_REFUSED:
        return MISCONFIGURED
    return "refused the request" if answered(exc) else "unreachable"


def _to_check(exc: BaseException, setting: str) -> str:
    """What the operator of a misconfigured service checks: the server itself for ``MISCONF``
    (its disk, its snapshot settings), else ``setting`` (its name, never its value)."""
    if failure_fields(exc).get("code") == _SNAPSHOT_REFUSED:
        return "the Redis server's disk and its snapshot settings (dir, stop-writes-on-bgsave-error)"
    return setting


def unreachable(service: str, exc: BaseException, *, effect: str = "", setting: str = "") -> str:
    """``SERVICE KIND[, EFFECT] (cause)`` (:func:`outage_kind`, :func:`cause`), e.g. ``state store
    unreachable, no totals (ConnectionError)``; for a misconfigured one with a ``setting``, what to
    check: ``state store misconfigured (AuthenticationError); check STATE_URL``."""
    kind = outage_kind(exc)
    said = f"{service} {kind}{f', {effect}' if effect else ''} ({cause(exc)})"
    return f"{said}; check {_to_check(exc, setting)}" if kind == MISCONFIGURED and setting else said


def store_outage(exc: BaseException, effect: str = "") -> str:
    """:func:`unreachable` for the state store, naming :data:`STORE_SETTING` when it is misconfigured."""
    return unreachable(STORE, exc, effect=effect, setting=STORE_SETTING)


def store_failed(exc: BaseException, request: str = "") -> str:
    """Why something stopped, for a note that goes on to say what it left: ``the state store did
    not answer [REQUEST]`` only when nothing answered, else ``the state store refused [REQUEST]``
    and, misconfigured, which setting to check (:func:`outage_kind`)."""
    kind = outage_kind(exc)
    if kind == "unreachable":
        return f"the {STORE} did not answer{f' {request}' if request else ''}"
    said = f"the {STORE} refused {request or 'the request'}"
    return (
        f"{said}, {MISCONFIGURED}: check {_to_check(exc, STORE_SETTING)}" if kind == MISCONFIGURED else said
    )
