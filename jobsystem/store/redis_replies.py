"""Redis commands whose replies are read later: sent now by one thread, read by whichever thread
needs the answer first, in order, over a connection of their own.

The claims made at receipt use it (``jobsystem.runtime.claims_ahead``). A consumer thread sends a
burst's claims and hands the burst to the worker threads at once; the worker thread that takes the
first of them reads the answer when its ``Idempotency`` hook needs it. Meanwhile the store's round
trip overlaps the hand-off between threads and the hooks that run before (on an idle worker, a
round trip is about a tenth of a millisecond of work, a third of a millisecond of waiting).

Redis answers a connection's commands in the order they were sent, so replies are read in that
order: to read one, every reply before it is read first and kept for its own reader. A connection
that fails (refused, reset, timed out), or answers a refusal of this client's configuration
(``NOPERM``, a database index it lacks: a new connection may log in), loses every reply still to
come: each reader gets the store's error, and the line connects afresh on the next command. So
does a reader interrupted during its read (a time limit, a cancellation): the replies after it
could no longer be told apart.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from typing import Any

import redis

from jobsystem.store.base import StoreMisconfigured, StoreUnavailable
from jobsystem.store.redis import RedisStore, redis_error, send_packed

__all__ = ["LaterReply", "ReplyLine"]


class LaterReply:
    """The reply to one command sent on a :class:`ReplyLine`; call it to read it (raises the
    store's error for an error reply or a failed connection)."""

    __slots__ = ("_error", "_line", "_read", "_value")

    def __init__(self, line: ReplyLine) -> None:
        self._line = line
        self._read = False
        self._value: Any = None
        self._error: BaseException | None = None

    def __call__(self) -> Any:
        if not self._read:
            self._line.read_until(self)
        if self._error is not None:
            raise self._error
        return self._value

    def _settle(self, value: Any = None, error: BaseException | None = None) -> None:
        self._value, self._error, self._read = value, error, True


class ReplyLine:
    """One connection of a :class:`~jobsystem.store.redis.RedisStore` (per process, made on first
    use and again after a fork) on which commands are sent now and their replies read later.

    A command is sent without redis-py's health check, whose PING would read a reply sent before
    it as its own.
    """

    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self._conn: Any = None
        self._pid = 0
        self._waiting: deque[LaterReply] = deque()
        self._lock = threading.Lock()

    def send(self, *command: Any) -> LaterReply:
        """Send ``command``; its reply is read when the returned :class:`LaterReply` is called."""
        reply = LaterReply(self)
        with self._lock:
            if self._pid != os.getpid():  # first use, or a forked child: the parent's are not its own
                self._conn, self._waiting, self._pid = None, deque(), os.getpid()
            self._waiting.append(reply)
            try:
                if self._conn is None:
                    self._conn = self.store.client.connection_pool.make_connection()
                send_packed(self._conn, command, check_health=False)
            except BaseException as exc:
                self._fail(exc)
                if not isinstance(exc, redis.RedisError):
                    raise  # an interruption: its own thread sees it
        return reply

    def read_until(self, reply: LaterReply) -> None:
        """Read the replies in order up to ``reply``'s, each kept for its own reader."""
        with self._lock:
            while not reply._read:
                if not self._waiting or self._pid != os.getpid():  # sent by a parent before a fork
                    reply._settle(error=StoreUnavailable("redis: reply lost: sent by another process"))
                    return
                try:
                    value = self._conn.read_response()
                except redis.ResponseError as exc:  # an error reply: the connection itself is fine ...
                    error = _kept_error(exc)
                    self._waiting.popleft()._settle(error=error)
                    if isinstance(error, StoreMisconfigured):  # ... unless it refuses this login
                        self._fail(exc)
                except BaseException as exc:
                    self._fail(exc)
                    if not isinstance(exc, redis.RedisError):
                        raise  # an interruption (a time limit): its own thread sees it
                else:
                    self._waiting.popleft()._settle(value)

    def _fail(self, exc: BaseException) -> None:
        """The connection failed (sending or reading): every reply still waiting gets the store's
        error; the next command connects afresh."""
        error: StoreUnavailable
        if isinstance(exc, redis.RedisError):
            error = redis_error(exc)
        else:
            error = StoreUnavailable(f"redis: reply lost: {type(exc).__name__} on the connection")
        for waiting in self._waiting:
            waiting._settle(error=error)
        self._waiting.clear()
        if self._conn is not None:
            self._conn.disconnect()


def _kept_error(exc: redis.ResponseError) -> BaseException:
    """``NOSCRIPT`` stays redis-py's error, so the script's caller can load the script and retry;
    every other error reply is the store's error."""
    return exc if isinstance(exc, redis.exceptions.NoScriptError) else redis_error(exc)
