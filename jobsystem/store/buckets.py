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

A take may also ask for a **lease** (``lease`` extra tokens, for a worker process to hand to its
threads without a round trip). It is granted only with a ``run`` answer to a take without a slot,
when the bucket is not drained, still holds at least twice the lease after the take, and the
tokens out on lease in the current lease period stay within a quarter of ``burst``. Leased tokens
leave the bucket at once, and until the lease period ends (``lease_ms`` after the first lease of
the period; every lease of the period ends with it) the bucket refills only up to
``burst - tokens out on lease``. Leaseholders drop what they have not used when it ends. So the
tokens in the bucket plus those held on lease never exceed ``burst``, and no window of ``t``
seconds starts more than ``burst + rate * t`` jobs, leases or not.

:meth:`BucketBackend.drain` empties a bucket for a while (an upstream answered "slow down"): new
takes get slots after it, and slots handed out before it are void.

Redis: one Lua script for any number of takes (one round trip for a whole coalesced batch).
SQLite: the same arithmetic in Python inside one ``BEGIN IMMEDIATE`` transaction.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Literal

from jobsystem.store.base import Backends, StateStore, StoreUnavailable
from jobsystem.store.redis import RedisStore

Status = Literal["run", "wait", "refused"]

#: A bucket's state is kept this long after it would be full again (then it is the same as none).
LINGER_MS = 1_000


@dataclass(slots=True)  # not frozen: a frozen __init__ sets each field through object.__setattr__
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
    #: Extra tokens wanted on lease (0: none), and the length of a lease period.
    lease: float = 0.0
    lease_ms: int = 0


@dataclass(frozen=True)
class Take:
    """The answer to a take (see the module docstring)."""

    status: Status
    #: Milliseconds from now until the slot (``wait``), or until asking again makes sense (``refused``).
    wait_ms: int
    #: The slot on the store's clock (``run``: now; ``wait``: the reserved slot; ``refused``: when
    #: to ask again).
    at_ms: int
    #: Extra tokens granted on lease (0: none), and the milliseconds left until the lease ends.
    leased: float = 0.0
    lease_left_ms: int = 0


@dataclass
class _Bucket:
    tokens: float
    ts: float
    blocked_until: float
    #: Tokens out on lease in the lease period ending at ``lease_end``.
    leased: float = 0.0
    lease_end: float = 0.0


def _refill(bucket: _Bucket | None, request: TakeRequest, now: float) -> _Bucket:
    if bucket is None:
        return _Bucket(request.burst, now, 0.0)
    rate = request.rate / 1000
    if bucket.leased and bucket.lease_end <= now:  # the lease period is over: refill up to its end
        if bucket.lease_end > bucket.ts:
            bucket.tokens = min(
                request.burst - bucket.leased, bucket.tokens + (bucket.lease_end - bucket.ts) * rate
            )
            bucket.ts = bucket.lease_end
        bucket.leased = 0.0
    if now > bucket.ts:
        bucket.tokens = min(request.burst - bucket.leased, bucket.tokens + (now - bucket.ts) * rate)
        bucket.ts = now
    return bucket


def _lease(bucket: _Bucket, request: TakeRequest, now: float) -> tuple[float, int]:
    """Lease ``request.lease`` tokens after a ``run`` take, if the bucket can spare them."""
    want = request.lease
    if (
        want <= 0
        or now < bucket.blocked_until
        or bucket.tokens < 2 * want
        or bucket.leased + want > request.burst / 4
    ):
        return 0.0, 0
    if bucket.lease_end <= now:
        bucket.lease_end = now + request.lease_ms
    bucket.tokens -= want
    bucket.leased += want
    return want, math.floor(bucket.lease_end - now)


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
    if wait == 0 and slot is None:
        leased, left = _lease(bucket, request, now)
        return Take("run", 0, math.ceil(now), leased, left), True
    return Take("run" if wait == 0 else "wait", wait, math.ceil(now + wait_f)), True


def _ttl_ms(bucket: _Bucket, burst: float, rate: float, now: float, linger_ms: int) -> int:
    full_in = (burst - bucket.tokens) * 1000 / rate
    return math.ceil(max(full_in, bucket.blocked_until - now, bucket.lease_end - now, 0.0)) + linger_ms


@dataclass(frozen=True)
class Level:
    """A bucket as it stands (read without taking): ``tokens`` now (negative while slots are
    reserved ahead), the tokens ``reserved`` by waiting jobs, and until when it is drained."""

    tokens: float
    reserved: float
    blocked_until_ms: float


class BucketBackend(ABC):
    """The bucket operations, one implementation per store backend."""

    #: How long a bucket's state is kept after it is full again (ms).
    linger_ms: int

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

-- A bucket refilled to now (rate per ms); see _refill, its Python twin.
local function load(key, rate, burst)
  local h = redis.call('HMGET', key, 'tokens', 'ts', 'until', 'lout', 'lend')
  local b = {tokens = tonumber(h[1]), ts = tonumber(h[2]), blocked = tonumber(h[3]) or 0,
             lout = tonumber(h[4]) or 0, lend = tonumber(h[5]) or 0}
  if b.tokens == nil then b.tokens, b.ts = burst, now end
  if b.lout > 0 and b.lend <= now then
    if b.lend > b.ts then
      b.tokens, b.ts = math.min(burst - b.lout, b.tokens + (b.lend - b.ts) * rate), b.lend
    end
    b.lout = 0
  end
  if now > b.ts then b.tokens, b.ts = math.min(burst - b.lout, b.tokens + (now - b.ts) * rate), now end
  return b
end

local function save(key, b, rate, burst, linger)
  redis.call('HSET', key, 'tokens', string.format('%.17g', b.tokens), 'ts', string.format('%.3f', b.ts),
             'until', string.format('%.3f', b.blocked), 'lout', string.format('%.17g', b.lout),
             'lend', string.format('%.3f', b.lend))
  local ttl = math.max((burst - b.tokens) / rate, b.blocked - now, b.lend - now, 0)
  redis.call('PEXPIRE', key, math.ceil(ttl) + linger)
end
"""

#: Takes for every key of KEYS; the arguments of key i start at ARGV[base + 8 * (i - 1) + 1].
_TAKE_LOOP = """
local out = {}
for i, key in ipairs(KEYS) do
  local a = base + 8 * (i - 1)
  local rate, burst, cost = tonumber(ARGV[a + 1]) / 1000, tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local horizon, slot, linger = tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5]), tonumber(ARGV[a + 6])
  local want, period = tonumber(ARGV[a + 7]), tonumber(ARGV[a + 8])
  local b = load(key, rate, burst)
  if slot >= 0 and slot >= now and slot >= b.blocked then
    local wait = math.ceil(slot - now)
    out[i] = {wait == 0 and 'run' or 'wait', wait, slot, '0', 0}
  else
    local wait = 0
    if b.tokens < cost then wait = (cost - b.tokens) / rate end
    if wait > horizon then
      out[i] = {'refused', math.ceil(wait - horizon), math.ceil(now + wait - horizon), '0', 0}
    else
      b.tokens = b.tokens - cost
      local leased, left = 0, 0
      if wait == 0 and slot < 0 and want > 0 and now >= b.blocked and b.tokens >= 2 * want
         and b.lout + want <= burst / 4 then
        if b.lend <= now then b.lend = now + period end
        b.tokens, b.lout, leased, left = b.tokens - want, b.lout + want, want, math.floor(b.lend - now)
      end
      save(key, b, rate, burst, linger)
      out[i] = {wait == 0 and 'run' or 'wait', math.ceil(wait), math.ceil(now + wait),
                string.format('%.17g', leased), left}
    end
  end
end
return out
"""

#: Drains KEYS[1] (ARGV[1..4]: rate, burst, for_ms, linger).
_DRAIN_BODY = """
local rate, burst, span = tonumber(ARGV[1]) / 1000, tonumber(ARGV[2]), tonumber(ARGV[3])
local b = load(KEYS[1], rate, burst)
b.tokens = math.min(b.tokens, -rate * span)
b.blocked = math.max(b.blocked, now + span)
save(KEYS[1], b, rate, burst, tonumber(ARGV[4]))
"""

_TAKE = _NOW + "local base = 0\n" + _TAKE_LOOP
_DRAIN = _NOW + "do\n" + _DRAIN_BODY + "end\nreturn 0\n"
#: A drain, then a take from the drained bucket (ARGV[5..12]), in one call.
_DRAIN_TAKE = _NOW + "do\n" + _DRAIN_BODY + "end\nlocal base = 4\n" + _TAKE_LOOP


class RedisBuckets(BucketBackend):
    """Buckets as Redis hashes (``tokens``, ``ts``, ``until``) expiring ``linger_ms`` after they
    are full again."""

    def __init__(self, store: RedisStore, *, linger_ms: int = LINGER_MS) -> None:
        self.store = store
        self.linger_ms = linger_ms
        self._take = store.script(_TAKE)
        self._drain = store.script(_DRAIN)
        self._drain_take = store.script(_DRAIN_TAKE)

    def _key(self, key: str) -> str:
        return self.store.key("rate:" + key)

    def take_many(self, requests: list[TakeRequest]) -> list[Take]:
        """One script call for every request: one round trip, whatever their number."""
        args: list[float | int] = []
        for r in requests:
            args += _take_args(r, self.linger_ms)
        with self.store.errors():
            replies = self._take(keys=[self._key(r.key) for r in requests], args=args)
        return [_reply(reply) for reply in replies]

    def drain_and_take(self, for_ms: int, request: TakeRequest) -> Take:
        r = request
        args = [r.rate, r.burst, for_ms, self.linger_ms, *_take_args(r, self.linger_ms)]
        with self.store.errors():
            (reply,) = self._drain_take(keys=[self._key(r.key)], args=args)
        return _reply(reply)

    def peek(self, key: str, rate: float, burst: float) -> Level:
        with self.store.errors():
            seconds, micros = self.store.client.time()
            raw = self.store.client.hmget(self._key(key), ["tokens", "ts", "until", "lout", "lend"])
        now = int(seconds) * 1000 + int(micros) / 1000
        tokens, ts, *rest = raw
        stored = (
            None
            if tokens is None or ts is None
            else _Bucket(float(tokens), float(ts), *(float(value or 0) for value in rest))
        )
        return _level(_refill(stored, TakeRequest(key, rate, burst, 0, 0), now))

    def drain(self, key: str, rate: float, burst: float, for_ms: int) -> None:
        with self.store.errors():
            self._drain(keys=[self._key(key)], args=[rate, burst, for_ms, self.linger_ms])

    def reset(self, key: str) -> None:
        with self.store.errors():
            self.store.client.delete(self._key(key))


def _level(bucket: _Bucket) -> Level:
    return Level(bucket.tokens, max(0.0, -bucket.tokens), bucket.blocked_until)


def _take_args(r: TakeRequest, linger_ms: int) -> list[float | int]:
    slot = -1 if r.slot_ms is None else r.slot_ms
    return [r.rate, r.burst, r.cost, r.horizon_ms, slot, linger_ms, r.lease, r.lease_ms]


def _reply(reply: list[bytes | str | int]) -> Take:
    """A take answered by the Lua script: ``[status, wait_ms, at_ms, leased, lease_left_ms]``."""
    try:
        status, wait, at, leased, left = reply
        return Take(_status(status), int(wait), int(at), float(leased), int(left))  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise StoreUnavailable(f"unexpected reply {reply!r}") from exc


def _status(value: bytes | str) -> Status:
    status = value.decode() if isinstance(value, bytes) else value
    if status not in ("run", "wait", "refused"):  # a reply of the wrong shape
        raise StoreUnavailable(f"unexpected reply {status!r}")
    return status  # type: ignore[return-value]


def bucket_backend(store: StateStore, *, linger_ms: int = LINGER_MS) -> BucketBackend:
    """The bucket operations for ``store``'s backend; a bucket's state is deleted ``linger_ms``
    after it is full again (the tests shorten it so as not to wait a second)."""
    # Imported here: the SQLite backend builds on this module's arithmetic and interface.
    from jobsystem.store.buckets_sqlite import SqliteBuckets

    return store.operations(
        Backends(
            redis=lambda redis: RedisBuckets(redis, linger_ms=linger_ms),
            sqlite=lambda sqlite: SqliteBuckets(sqlite, linger_ms=linger_ms),
        )
    )
