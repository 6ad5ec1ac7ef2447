"""What a store failure is: the error it wraps, a Redis reply's code, and whether waiting helps.

Every backend error surfaces as :class:`~jobsystem.store.base.StoreUnavailable`, which is right for
a caller that fails closed, but a writer that retries must tell two kinds apart. A refused
connection, a timeout, a full or read-only Redis (``OOM``, ``READONLY``, ``MISCONF``: it cannot save
its snapshot, its disk is full), a busy or locked SQLite file pass: retrying the same write later
succeeds. A ``WRONGTYPE`` reply (the key holds another
type), a script's own ``error_reply``, an ``ERR`` for bad arguments, or any bug in the writer's own
code fail the same way every time: retried, they block every write queued behind them for good.
A misconfigured store (:func:`misconfigured`: refused credentials, ``NOAUTH``, ``WRONGPASS``,
``NOPERM``, a database index the server lacks) is neither: an operator mends it, yet it may pass
too (a proxy whose Redis restarted answers ``NOAUTH`` on a connection opened before; a new one
logs in again). A writer decides per write whether to wait for it.
"""

from __future__ import annotations

import re
import sqlite3

import redis

from jobsystem.store.base import StoreMisconfigured, StoreUnavailable

__all__ = [
    "REFUSED",
    "TRANSIENT_REPLY_CODES",
    "WRAPPERS",
    "answered",
    "misconfigured",
    "reply_code",
    "transient",
    "wrapped",
]

#: Errors that only carry another's failure: what they wrap says what failed.
WRAPPERS: tuple[type[BaseException], ...] = (StoreUnavailable,)

#: Redis error replies that mean "not now": out of memory, a replica or a failover in progress, a
#: script running, the dataset loading, a cluster resharding or without enough replicas, a
#: snapshot it cannot save (``MISCONF``: its disk is full, until an operator frees room).
TRANSIENT_REPLY_CODES = frozenset(
    {"OOM", "READONLY", "BUSY", "LOADING", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN", "NOREPLICAS", "MISCONF"}
)

#: SQLite's primary result codes that mean "not now": another connection holds the lock, the
#: disk is full, the file could not be read or written.
_TRANSIENT_SQLITE_CODES = frozenset(
    {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR}
)
#: The same, by their text, for an error sqlite3 did not raise itself (no ``sqlite_errorcode``).
_TRANSIENT_SQLITE_TEXT = (
    "database is locked",
    "table is locked",
    "database or disk is full",
    "disk I/O error",
)

#: An error reply's code: a short word all in capitals (a word of the text in any other shape,
#: an address, a name, is not a code and is never logged at the line's level).
_CODE = re.compile(r"[A-Z]{2,16}")

#: The error replies whose code redis-py strips from the text (it names them by class instead):
#: recent releases keep it as ``status_code``, older ones the project allows (``redis>=5.0``) do not.
_CLASS_CODES: dict[type[redis.RedisError], str] = {
    redis.exceptions.OutOfMemoryError: "OOM",
    redis.exceptions.ReadOnlyError: "READONLY",
    redis.exceptions.NoScriptError: "NOSCRIPT",
    redis.exceptions.BusyLoadingError: "LOADING",
    redis.exceptions.ExecAbortError: "EXECABORT",
    redis.exceptions.NoPermissionError: "NOPERM",
    redis.exceptions.TryAgainError: "TRYAGAIN",
    redis.exceptions.MasterDownError: "MASTERDOWN",  # before its base class, ClusterDownError
    redis.exceptions.ClusterDownError: "CLUSTERDOWN",
}


#: Redis errors that refuse this client (its credentials, its rights), whatever class redis-py
#: derives them from: no retry is let in.
REFUSED = (
    redis.exceptions.AuthenticationError,
    redis.exceptions.AuthorizationError,
    redis.exceptions.NoPermissionError,
)


def wrapped(exc: BaseException) -> BaseException | None:
    """The first error in ``exc``'s chain (``__cause__``, else ``__context__``) that is not a
    wrapper, or None when ``exc`` is no wrapper or wraps nothing else."""
    seen: set[int] = set()
    error: BaseException | None = exc
    while isinstance(error, WRAPPERS) and id(error) not in seen:
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None if error is exc else error


def reply_code(error: BaseException) -> str | None:
    """A Redis error reply's code: what redis-py parsed (``status_code``, or the class of a reply
    whose code it strips from the text), else the text's first word when it has a code's shape."""
    if not isinstance(error, redis.RedisError):
        return None
    parsed = getattr(error, "status_code", None)
    if not isinstance(parsed, str):
        parsed = next((c for kind, c in _CLASS_CODES.items() if isinstance(error, kind)), None)
    if parsed is None and isinstance(error, redis.ResponseError):
        parsed = (str(error).split(maxsplit=1) or [""])[0]
    return parsed if parsed is not None and _CODE.fullmatch(parsed) else None


def misconfigured(exc: BaseException) -> bool:
    """Whether ``exc`` is a store's refusal of this client's configuration: a
    :class:`~jobsystem.store.base.StoreMisconfigured`, or a store error wrapping a :data:`REFUSED`."""
    return isinstance(exc, StoreMisconfigured) or (
        isinstance(exc, StoreUnavailable) and isinstance(wrapped(exc), REFUSED)
    )


def answered(exc: BaseException) -> bool:
    """Whether the store answered ``exc``'s request, with a refusal: a :func:`misconfigured`
    store, a Redis error reply, a SQLite error (the file is there); not a lost, refused or
    timed-out connection, nor a store error that wraps nothing."""
    if misconfigured(exc):
        return True
    cause = wrapped(exc) if isinstance(exc, StoreUnavailable) else None
    return isinstance(cause, redis.ResponseError | sqlite3.Error)


def transient(exc: BaseException) -> bool:
    """Whether the same write, tried again later, may succeed: ``exc`` is a store error that wraps
    a lost or timed-out connection, a Redis reply in :data:`TRANSIENT_REPLY_CODES`, or a busy,
    locked, full or failing SQLite file. A :func:`misconfigured` store (``NOAUTH``, ``WRONGPASS``,
    ``NOPERM``, a database index it lacks) is not counted: the writer decides whether to wait.
    Anything else (another reply, a store error that wraps nothing, any other exception) fails
    again the same way."""
    if isinstance(exc, StoreMisconfigured):
        return False
    cause = wrapped(exc) if isinstance(exc, StoreUnavailable) else None
    if isinstance(cause, REFUSED):  # redis-py's ConnectionError, yet the server's answer
        return False
    if isinstance(cause, redis.ResponseError):
        return reply_code(cause) in TRANSIENT_REPLY_CODES
    if isinstance(cause, redis.RedisError):
        return isinstance(cause, redis.ConnectionError | redis.TimeoutError)  # not a DataError: bad arguments
    if isinstance(cause, sqlite3.Error):
        code = getattr(cause, "sqlite_errorcode", None)
        if isinstance(code, int):
            return (code & 0xFF) in _TRANSIENT_SQLITE_CODES
        return any(text in str(cause) for text in _TRANSIENT_SQLITE_TEXT)
    return isinstance(cause, ConnectionError | TimeoutError)
