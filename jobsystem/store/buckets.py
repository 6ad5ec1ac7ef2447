"""Token buckets in the state store: take a token now, or reserve a future slot, in one atomic step.

A bucket holds ``tokens`` (at most ``burst``) refilled at ``rate`` per second, measured by the
store's clock (Redis ``TIME``; the host clock for SQLite, which serves one host): every worker on
every host spends from the same budget, and skewed worker clocks change nothing.

A take asks for ``cost`` tokens and is answered in one round trip:

- ``run``: the tokens were there; start now.
- ``wait``: not enough tokens, but the bucket lets the caller borrow against its future refill: the
  tokens are taken anyway (the level goes negative) and the caller owns the slot ``at_ms`` at which
  they will have been refilled. Slots are handed out in order, so concurrent callers get distinct,
  evenly spaced slots instead of all waking at the same moment. Borrowing is bounded by
  ``horizon_ms``: no slot lies further ahead than that.
- ``refused``: even a slot would lie beyond the horizon; nothing was taken. ``wait_ms`` says when
  a slot would come within the horizon again.

A caller that comes back with the slot it was given (``slot_ms``) is told to wait for it or run,
without taking again, as long as the slot has not passed and the bucket was not drained after it
was handed out. A slot that has passed is void: the caller takes afresh (that token is lost,
which errs on the side of the upstream's quota).

:meth:`BucketBackend.drain` empties a bucket for a while (an upstream answered "slow down"): new
takes get slots after it, and slots handed out before it are void.

Redis: one Lua script for any number of takes (one round trip for a whole coalesced batch).
SQLite: the same arithmetic in Python inside one ``BEGIN IMMEDIATE`` transaction.
"""

from __future__ import annotations

import math
import sqlite3
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Literal

from jobsystem.store import for_backend
from jobsystem.store.base import StateStore, StoreUnavailable
from jobsystem.store.redis import RedisStore
from jobsystem.store.sqlite import SqliteStore, sqlite_error

Status = Literal["run", "wait", "refused"]

#: A bucket's state is kept this long after it would be full again (then it is the same as none).
_LINGER_MS = 1_000


@dataclass(frozen=True)
class TakeRequest:
    """Take ``cost`` tokens from bucket ``key`` (``rate`` per second, capacity ``burst``)."""

    key: str
    rate: float
    burst: float
    cost: float
    #: The furthest ahead a reserved slot may lie.
    horizon_ms: int
    #: A slot this caller was given before (store clock, ms), or None.
    slot_ms: int | None = None


@dataclass(frozen=True)
class Take:
    """The answer to a take (see the module docstring)."""

    status: Status
    #: Milliseconds from now until the slot (``wait``), or until asking again makes sense (``refused``).
    wait_ms: int
    #: The slot on the store's clock (``run``: now; ``wait``: the reserved slot; ``refused``: when
    #: to ask again).
    at_ms: int


@dataclass
class _Bucket:
    tokens: float
    ts: float
    blocked_until: float


def _refill(bucket: _Bucket | None, request: TakeRequest, now: float) -> _Bucket:
    if bucket is None:
        return _Bucket(request.burst, now, 0.0)
    if now > bucket.ts:
        bucket.tokens = min(request.burst, bucket.tokens + (now - bucket.ts) * request.rate / 1000)
        bucket.ts = now
    return bucket


def _take(bucket: _Bucket, request: TakeRequest, now: float) -> tuple[Take, bool]:
    """The take's answer and whether ``bucket`` changed (SQLite's twin of the Lua script)."""
    slot = request.slot_ms
    if slot is not None and slot >= now and slot >= bucket.blocked_until:
        wait = math.ceil(slot - now)
        return Take("run" if wait == 0 else "wait", wait, slot), False
    wait_f = 0.0 if bucket.tokens >= request.cost else (request.cost - bucket.tokens) * 1000 / request.rate
    if wait_f > request.horizon_ms:
        again = wait_f - request.horizon_ms
        return Take("refused", math.ceil(again), math.ceil(now + again)), False
    bucket.tokens -= request.cost
    wait = math.ceil(wait_f)
    return Take("run" if wait == 0 else "wait", wait, math.ceil(now + wait_f)), True


def _ttl_ms(bucket: _Bucket, burst: float, rate: float, now: float) -> int:
    full_in = (burst - bucket.tokens) * 1000 / rate
    return math.ceil(max(full_in, bucket.blocked_until - now, 0.0)) + _LINGER_MS


@dataclass(frozen=True)
class Level:
    """A bucket as it stands (read without taking): ``tokens`` now (negative while slots are
    reserved ahead), the tokens ``reserved`` by waiting jobs, and until when it is drained."""

    tokens: float
    reserved: float
    blocked_until_ms: float


class BucketBackend(ABC):
    """The bucket operations, one implementation per store backend."""

    @abstractmethod
    def peek(self, key: str, rate: float, burst: float) -> Level:
        """Bucket ``key`` now, refilled to the store's clock; a bucket never used is full."""

    @abstractmethod
    def take_many(self, requests: list[TakeRequest]) -> list[Take]:
        """Answer each take in order, atomically (later requests see the tokens earlier ones took)."""

    def take(self, request: TakeRequest) -> Take:
        return self.take_many([request])[0]

    @abstractmethod
    def drain(self, key: str, rate: float, burst: float, for_ms: int) -> None:
        """Leave bucket ``key`` without a token for ``for_ms`` from now, and void the slots
        handed out before then."""

    @abstractmethod
    def drain_and_take(self, for_ms: int, request: TakeRequest) -> Take:
        """:meth:`drain` ``request``'s bucket for ``for_ms``, then answer ``request`` from it,
        atomically in one store operation (an upstream said "slow down")."""

    @abstractmethod
    def reset(self, key: str) -> None:
        """Forget bucket ``key``: it is full again and its slots are void (an operator's tool)."""


_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
"""

#: Takes for every key of KEYS; the arguments of key i start at ARGV[base + 6 * (i - 1) + 1].
_TAKE_LOOP = """
local out = {}
for i, key in ipairs(KEYS) do
  local a = base + 6 * (i - 1)
  local rate, burst, cost = tonumber(ARGV[a + 1]) / 1000, tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local horizon, slot = tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5])
  local h = redis.call('HMGET', key, 'tokens', 'ts', 'until')
  local tokens, ts, blocked = tonumber(h[1]), tonumber(h[2]), tonumber(h[3]) or 0
  if tokens == nil then tokens, ts = burst, now end
  if now > ts then tokens, ts = math.min(burst, tokens + (now - ts) * rate), now end
  if slot >= 0 and slot >= now and slot >= blocked then
    local wait = math.ceil(slot - now)
    out[i] = {wait == 0 and 'run' or 'wait', wait, slot}
  else
    local wait = 0
    if tokens < cost then wait = (cost - tokens) / rate end
    if wait > horizon then
      out[i] = {'refused', math.ceil(wait - horizon), math.ceil(now + wait - horizon)}
    else
      tokens = tokens - cost
      redis.call('HSET', key, 'tokens', string.format('%.17g', tokens), 'ts', string.format('%.3f', now),
                 'until', string.format('%.3f', blocked))
      local ttl = math.max((burst - tokens) / rate, blocked - now, 0)
      redis.call('PEXPIRE', key, math.ceil(ttl) + tonumber(ARGV[a + 6]))
      out[i] = {wait == 0 and 'run' or 'wait', math.ceil(wait), math.ceil(now + wait)}
    end
  end
end
return out
"""

#: Drains KEYS[1] (ARGV[1..4]: rate, burst, for_ms, linger).
_DRAIN_BODY = """
local rate, burst, span = tonumber(ARGV[1]) / 1000, tonumber(ARGV[2]), tonumber(ARGV[3])
local h = redis.call('HMGET', KEYS[1], 'tokens', 'ts', 'until')
local tokens, ts, blocked = tonumber(h[1]), tonumber(h[2]), tonumber(h[3]) or 0
if tokens == nil then tokens, ts = burst, now end
if now > ts then tokens = math.min(burst, tokens + (now - ts) * rate) end
tokens = math.min(tokens, -rate * span)
blocked = math.max(blocked, now + span)
redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens), 'ts', string.format('%.3f', now),
           'until', string.format('%.3f', blocked))
local ttl = math.max((burst - tokens) / rate, blocked - now, 0)
redis.call('PEXPIRE', KEYS[1], math.ceil(ttl) + tonumber(ARGV[4]))
"""

_TAKE = _NOW + "local base = 0\n" + _TAKE_LOOP
_DRAIN = _NOW + "do\n" + _DRAIN_BODY + "end\nreturn 0\n"
#: A drain, then a take from the drained bucket (ARGV[5..10]), in one call.
_DRAIN_TAKE = _NOW + "do\n" + _DRAIN_BODY + "end\nlocal base = 4\n" + _TAKE_LOOP


class RedisBuckets(BucketBackend):
    """Buckets as Redis hashes (``tokens``, ``ts``, ``until``) expiring once full again."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self._take = store.script(_TAKE)
        self._drain = store.script(_DRAIN)
        self._drain_take = store.script(_DRAIN_TAKE)

    def _key(self, key: str) -> str:
        return self.store.key("rate:" + key)

    def take_many(self, requests: list[TakeRequest]) -> list[Take]:
        """One script call for every request: one round trip, whatever their number."""
        args: list[float | int] = []
        for r in requests:
            slot = -1 if r.slot_ms is None else r.slot_ms
            args += [r.rate, r.burst, r.cost, r.horizon_ms, slot, _LINGER_MS]
        with self.store.errors():
            replies = self._take(keys=[self._key(r.key) for r in requests], args=args)
        return [Take(_status(status), int(wait), int(at)) for status, wait, at in replies]

    def drain_and_take(self, for_ms: int, request: TakeRequest) -> Take:
        r = request
        slot = -1 if r.slot_ms is None else r.slot_ms
        args = [r.rate, r.burst, for_ms, _LINGER_MS, r.rate, r.burst, r.cost, r.horizon_ms, slot, _LINGER_MS]
        with self.store.errors():
            ((status, wait, at),) = self._drain_take(keys=[self._key(r.key)], args=args)
        return Take(_status(status), int(wait), int(at))

    def peek(self, key: str, rate: float, burst: float) -> Level:
        with self.store.errors():
            seconds, micros = self.store.client.time()
            raw = self.store.client.hmget(self._key(key), ["tokens", "ts", "until"])
        now = int(seconds) * 1000 + int(micros) / 1000
        tokens, ts, until = raw
        stored = (
            None if tokens is None or ts is None else _Bucket(float(tokens), float(ts), float(until or 0))
        )
        return _level(_refill(stored, TakeRequest(key, rate, burst, 0, 0), now))

    def drain(self, key: str, rate: float, burst: float, for_ms: int) -> None:
        with self.store.errors():
            self._drain(keys=[self._key(key)], args=[rate, burst, for_ms, _LINGER_MS])

    def reset(self, key: str) -> None:
        with self.store.errors():
            self.store.client.delete(self._key(key))


_SCHEMA = """
CREATE TABLE IF NOT EXISTS rate_buckets (
    key TEXT PRIMARY KEY,
    tokens REAL NOT NULL,
    ts REAL NOT NULL,
    blocked_until REAL NOT NULL,
    expires_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS rate_buckets_expires ON rate_buckets (expires_at)
"""


class SqliteBuckets(BucketBackend):
    """Buckets as rows of one table; every take runs in a ``BEGIN IMMEDIATE`` transaction."""

    def __init__(self, store: SqliteStore) -> None:
        self.store = store
        store.ensure_schema(_SCHEMA)

    @staticmethod
    def _now() -> float:
        # The store's clock for SQLite is the host's (one host); sub-millisecond, like Redis TIME.
        return time.time() * 1000

    def _load(self, conn: sqlite3.Connection, key: str, now: float) -> _Bucket | None:
        row = conn.execute(
            "SELECT tokens, ts, blocked_until FROM rate_buckets WHERE key = ? AND expires_at > ?",
            (self.store.key(key), now),
        ).fetchone()
        return _Bucket(float(row[0]), float(row[1]), float(row[2])) if row else None

    def _save(self, conn: sqlite3.Connection, key: str, bucket: _Bucket, burst: float, rate: float) -> None:
        expires = bucket.ts + _ttl_ms(bucket, burst, rate, bucket.ts)
        conn.execute(
            "INSERT INTO rate_buckets (key, tokens, ts, blocked_until, expires_at) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT(key) DO UPDATE SET tokens = excluded.tokens, ts = excluded.ts, "
            "blocked_until = excluded.blocked_until, expires_at = excluded.expires_at",
            (self.store.key(key), bucket.tokens, bucket.ts, bucket.blocked_until, expires),
        )

    def take_many(self, requests: list[TakeRequest]) -> list[Take]:
        """All the requests in one transaction; expired rows are swept on the way."""
        answers: list[Take] = []
        with self.store.transaction() as conn:
            now = self._now()
            conn.execute("DELETE FROM rate_buckets WHERE expires_at <= ?", (now,))
            for request in requests:
                bucket = _refill(self._load(conn, request.key, now), request, now)
                answer, changed = _take(bucket, request, now)
                if changed:
                    self._save(conn, request.key, bucket, request.burst, request.rate)
                answers.append(answer)
        return answers

    def peek(self, key: str, rate: float, burst: float) -> Level:
        now = self._now()
        try:
            stored = self._load(self.store.connection(), key, now)
        except sqlite3.Error as exc:
            raise sqlite_error(exc) from exc
        return _level(_refill(stored, TakeRequest(key, rate, burst, 0, 0), now))

    def drain(self, key: str, rate: float, burst: float, for_ms: int) -> None:
        with self.store.transaction() as conn:
            self._drain_in(conn, self._now(), key, rate, burst, for_ms)

    def drain_and_take(self, for_ms: int, request: TakeRequest) -> Take:
        with self.store.transaction() as conn:
            now = self._now()
            bucket = self._drain_in(conn, now, request.key, request.rate, request.burst, for_ms)
            answer, changed = _take(bucket, request, now)
            if changed:
                self._save(conn, request.key, bucket, request.burst, request.rate)
        return answer

    def _drain_in(
        self, conn: sqlite3.Connection, now: float, key: str, rate: float, burst: float, for_ms: int
    ) -> _Bucket:
        bucket = _refill(self._load(conn, key, now), TakeRequest(key, rate, burst, 0, 0), now)
        bucket.tokens = min(bucket.tokens, -rate * for_ms / 1000)
        bucket.blocked_until = max(bucket.blocked_until, now + for_ms)
        self._save(conn, key, bucket, burst, rate)
        return bucket

    def reset(self, key: str) -> None:
        with self.store.transaction() as conn:
            conn.execute("DELETE FROM rate_buckets WHERE key = ?", (self.store.key(key),))


def _level(bucket: _Bucket) -> Level:
    return Level(bucket.tokens, max(0.0, -bucket.tokens), bucket.blocked_until)


def _status(value: bytes | str) -> Status:
    status = value.decode() if isinstance(value, bytes) else value
    if status not in ("run", "wait", "refused"):  # a reply of the wrong shape
        raise StoreUnavailable(f"unexpected reply {status!r}")
    return status  # type: ignore[return-value]


def bucket_backend(store: StateStore) -> BucketBackend:
    """The bucket operations for ``store``'s backend."""
    return for_backend(store, redis=RedisBuckets, sqlite=SqliteBuckets)
