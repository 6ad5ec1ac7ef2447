"""The state store on Redis: for production and many hosts.

Compound operations are Lua scripts, each atomic and one round trip, sent over a connection of the
calling thread (:class:`RedisScript`).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import redis

from jobsystem.store.base import Backends, Operations, StateStore, StoreMisconfigured, StoreUnavailable
from jobsystem.store.failures import REFUSED

if TYPE_CHECKING:
    from jobsystem.store.redis_replies import ReplyLine

hiredis: ModuleType | None
try:
    import hiredis
except ImportError:  # installed with redis[hiredis]; without it, redis-py packs commands itself
    hiredis = None

__all__ = ["RedisScript", "RedisStore", "delete_matching", "redis_error", "reply_text", "send_packed"]

#: Redis error replies (first word) that no amount of waiting fixes (a recent redis-py strips the
#: word from some, ``NOPERM``'s: their class says it, see ``REFUSED``).
_REDIS_MISCONFIGURED = ("NOAUTH", "WRONGPASS", "NOPERM")
_REDIS_MISCONFIGURED_TEXT = ("DB index is out of range", "unknown command", "invalid DB index")


def reply_text(value: Any) -> str:
    """A Redis reply (bytes from a script or a client without decoding) as text."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def send_packed(conn: Any, command: tuple[Any, ...], *, check_health: bool = True) -> None:
    """Send ``command`` on redis-py connection ``conn``, packed by hiredis in one call.

    redis-py's own packer passes each argument through its encoder in Python: a burst of 12 claims
    (63 arguments) took 60 us to pack, against 8 here, on the consumer thread that limits a loaded
    worker. The bytes are the same. Arguments are ``str``, ``bytes``, ``int`` or ``float``, as
    redis-py takes them; anything else is refused with redis-py's error, before anything is sent.
    """
    if hiredis is None:
        conn.send_command(*command, check_health=check_health)
        return
    try:
        packed = hiredis.pack_command(command)
    except TypeError as exc:
        raise redis.DataError(str(exc)) from exc
    conn.send_packed_command([packed], check_health=check_health)


def redis_error(exc: redis.RedisError) -> StoreUnavailable:
    """The store error for anything redis-py raised: misconfigured, or unavailable (everything
    else, error replies included: they mean "not now", so callers defer). It wraps ``exc``, which
    says whether a retry can help (:func:`jobsystem.store.failures.transient`)."""
    text = str(exc)
    misconfigured = isinstance(exc, REFUSED) or (
        isinstance(exc, redis.ResponseError)
        and (text.startswith(_REDIS_MISCONFIGURED) or any(t in text for t in _REDIS_MISCONFIGURED_TEXT))
    )
    kind = StoreMisconfigured if misconfigured else StoreUnavailable
    error = kind(f"redis: {type(exc).__name__}: {text}")
    error.__cause__ = exc  # kept with it: an error reply read later is raised away from its except
    return error


def delete_matching(client: redis.Redis, pattern: str, batch: int = 1_000) -> int:
    """Delete the keys matching ``pattern`` (SCAN, then UNLINK ``batch`` at a time); returns how
    many. It checks nothing: callers make sure ``pattern`` is a prefix of their own (a demo's, a
    bench's, a test's), never an environment's."""
    deleted, found = 0, []
    for key in client.scan_iter(pattern, count=batch):
        found.append(key)
        if len(found) >= batch:
            deleted += int(client.unlink(*found))
            found = []
    if found:
        deleted += int(client.unlink(*found))
    return deleted


_ACQUIRE_LEASE = """
local holder = redis.call('GET', KEYS[1])
if holder == false or holder == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""

_RELEASE_LEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""


class RedisScript:
    """A Lua script sent as ``EVALSHA`` straight over a dedicated connection of the calling thread.

    redis-py's own script call costs ~55 us of CPU per call here against ~15 us for the same
    command on a bare connection (pool checkout, retry and instrumentation wrappers); the claim and
    completion scripts run once per job, so the difference is most of what idempotency costs a
    worker. The script is loaded on first use and again after a Redis restart (``NOSCRIPT``).
    """

    def __init__(self, store: RedisStore, source: str) -> None:
        self.store = store
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def __call__(self, keys: list[str], args: list[Any]) -> Any:
        conn = self.store.raw_connection()
        try:
            try:
                return self._evalsha(conn, keys, args)
            except redis.exceptions.NoScriptError:  # Redis restarted or flushed its scripts
                conn.send_command("SCRIPT", "LOAD", self.source)
                conn.read_response()
                return self._evalsha(conn, keys, args)
        except redis.ResponseError as exc:  # an error reply: the connection itself is fine ...
            error = redis_error(exc)
            if isinstance(error, StoreMisconfigured):  # ... unless it refuses this login: log in anew
                conn.disconnect()
            raise error from exc
        except redis.RedisError as exc:
            conn.disconnect()
            raise redis_error(exc) from exc
        except BaseException:
            # Interrupted between the request and the read of its reply (an exception raised in
            # this thread: a time limit, a cancellation; redis-py covers only its own read): the
            # next call would read this call's reply as its own.
            conn.disconnect()
            raise

    def send_on(self, line: ReplyLine, keys: list[str], args: list[Any]) -> Callable[[], Any]:
        """Send the script on ``line`` now; the returned callable reads its reply (or, where Redis
        no longer has the script, runs it again over this thread's connection, which loads it)."""
        reply = line.send("EVALSHA", self.sha, len(keys), *keys, *args)

        def read() -> Any:
            try:
                return reply()
            except redis.exceptions.NoScriptError:
                return self(keys, args)

        return read

    def _evalsha(self, conn: Any, keys: list[str], args: list[Any]) -> Any:
        send_packed(conn, ("EVALSHA", self.sha, len(keys), *keys, *args))
        return conn.read_response()


class RedisStore(StateStore):
    """The state store on Redis; ``namespace`` prefixes every key."""

    kind = "redis"
    atomic_batch = False  # each script stands as it returns

    def __init__(
        self,
        url: str,
        *,
        namespace: str = "jobs:",
        socket_timeout: float = 2.0,
        client: redis.Redis | None = None,
    ) -> None:
        parts = urlsplit(url)
        self.url = url
        self.label = f"{parts.scheme}://{parts.hostname}:{parts.port or 6379}{parts.path}"
        self.namespace = namespace
        self.timeout = socket_timeout
        self.client: redis.Redis = client or redis.Redis.from_url(
            url,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_timeout,
            health_check_interval=30,
        )
        self._acquire = self.script(_ACQUIRE_LEASE)
        self._release = self.script(_RELEASE_LEASE)
        self._local = threading.local()

    def script(self, source: str) -> RedisScript:
        """A Lua script run over this thread's own connection (see :class:`RedisScript`)."""
        return RedisScript(self, source)

    def raw_connection(self) -> Any:
        """This thread's dedicated connection, outside the pool (made again after a fork)."""
        conn = getattr(self._local, "conn", None)
        if conn is None or getattr(self._local, "pid", None) != os.getpid():
            conn = self.client.connection_pool.make_connection()
            self._local.conn, self._local.pid = conn, os.getpid()
        return conn

    def operations(self, backends: Backends[Operations]) -> Operations:
        return backends.redis(self)

    @contextmanager
    def errors(self) -> Iterator[None]:
        """Turn anything redis-py raises into a store error (see :func:`redis_error`); after a
        refusal of the configuration the pool's idle connections are dropped, so that the next
        command logs in again (its connection is back in the pool by then)."""
        try:
            yield
        except redis.RedisError as exc:
            error = redis_error(exc)
            if isinstance(error, StoreMisconfigured):  # the connection that got it logs in anew
                self.client.connection_pool.disconnect(inuse_connections=False)
            raise error from exc

    def now_ms(self) -> int:
        with self.errors():
            seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def get(self, key: str) -> bytes | None:
        with self.errors():
            value = self.client.get(self.key(key))
        return value.encode() if isinstance(value, str) else value

    def set(self, key: str, value: bytes | str, ttl_ms: int | None = None) -> None:
        with self.errors():
            self.client.set(self.key(key), value, px=ttl_ms)

    def delete(self, *keys: str) -> None:
        if keys:
            with self.errors():
                self.client.delete(*(self.key(k) for k in keys))

    def acquire_lease(self, name: str, owner: str, ttl_ms: int) -> bool:
        with self.errors():
            return bool(self._acquire([self.key(name)], [owner, ttl_ms]))

    def release_lease(self, name: str, owner: str) -> bool:
        with self.errors():
            return bool(self._release([self.key(name)], [owner]))

    def lease_holder(self, name: str) -> str | None:
        value = self.get(name)
        return value.decode() if value is not None else None

    @contextmanager
    def batch(self) -> Iterator[StateStore]:
        yield self

    def ping(self) -> None:
        with self.errors():
            self.client.ping()

    def release_thread(self) -> None:
        """Nothing to give back: the connection pool is shared by every thread."""

    def close(self) -> None:
        self.client.close()
