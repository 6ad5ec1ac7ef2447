"""Token buckets in Redis: one Lua script per compound operation (atomic, one round trip for a
whole coalesced batch of takes), the twin of the arithmetic in ``jobsystem.store.buckets``, where
the contract is described.

A bucket is a hash (``tokens``, ``ts``, ``until``, and its lease period) expiring ``linger_ms``
after it is full again. Its slot records are a sorted set next to it (``rate-slots:<bucket>``,
members ``<message id>:<slot>`` scored by the slot) expiring ``linger_ms`` after its last slot;
a record is written only when a take defers, read only when a slot is brought back, and pruned
of passed slots when one is written and of drained ones by a drain.
"""

from __future__ import annotations

from jobsystem.store.base import StoreUnavailable
from jobsystem.store.buckets import (
    LINGER_MS,
    BucketBackend,
    Level,
    Status,
    Take,
    TakeRequest,
    _Bucket,
    _level,
    _refill,
)
from jobsystem.store.redis import RedisStore

__all__ = ["RedisBuckets"]

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

-- The slot records of a bucket: a sorted set of "owner:slot" scored by the slot (see hold).
local function member(owner, slot) return owner .. ':' .. string.format('%d', slot) end
"""

#: Takes for every pair of KEYS (a bucket, its slot records); the arguments of pair i start at
#: ARGV[base + 10 * (i - 1) + 1]. The records are read only for a slot brought back, and written
#: only for a deferral: a take without a slot that answers run touches the bucket alone.
_TAKE_LOOP = """
local function hold(held, owner, at, linger)
  redis.call('ZREMRANGEBYSCORE', held, '-inf', '(' .. string.format('%.3f', now))
  redis.call('ZADD', held, at, member(owner, at))
  local ttl = at - now + linger
  if redis.call('PTTL', held) < ttl then redis.call('PEXPIRE', held, math.ceil(ttl)) end
end

local out = {}
for i = 1, #KEYS / 2 do
  local key, held, a = KEYS[2 * i - 1], KEYS[2 * i], base + 10 * (i - 1)
  local rate, burst, cost = tonumber(ARGV[a + 1]) / 1000, tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local horizon, slot, linger = tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5]), tonumber(ARGV[a + 6])
  local want, period = tonumber(ARGV[a + 7]), tonumber(ARGV[a + 8])
  local owner, sleep = ARGV[a + 9], tonumber(ARGV[a + 10])
  local b = load(key, rate, burst)
  local kept = slot >= 0 and owner ~= '' and slot >= now and slot >= b.blocked
               and redis.call('ZSCORE', held, member(owner, slot))
  if kept then
    local wait = math.ceil(slot - now)
    if wait <= sleep then redis.call('ZREM', held, member(owner, slot)) end
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
      local at = math.ceil(now + wait)
      if wait > 0 and owner ~= '' and math.ceil(wait) > sleep then hold(held, owner, at, linger) end
      out[i] = {wait == 0 and 'run' or 'wait', math.ceil(wait), at, string.format('%.17g', leased), left}
    end
  end
end
return out
"""

#: Drains KEYS[1] and voids the records in KEYS[2] of slots before the drain's end (ARGV[1..4]:
#: rate, burst, for_ms, linger).
_DRAIN_BODY = """
local rate, burst, span = tonumber(ARGV[1]) / 1000, tonumber(ARGV[2]), tonumber(ARGV[3])
local b = load(KEYS[1], rate, burst)
b.tokens = math.min(b.tokens, -rate * span)
b.blocked = math.max(b.blocked, now + span)
save(KEYS[1], b, rate, burst, tonumber(ARGV[4]))
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. string.format('%.3f', b.blocked))
"""

_TAKE = _NOW + "local base = 0\n" + _TAKE_LOOP
_DRAIN = _NOW + "do\n" + _DRAIN_BODY + "end\nreturn 0\n"
#: A drain, then a take from the drained bucket (ARGV[5..14]), in one call.
_DRAIN_TAKE = _NOW + "do\n" + _DRAIN_BODY + "end\nlocal base = 4\n" + _TAKE_LOOP


class RedisBuckets(BucketBackend):
    """Buckets as Redis hashes (``tokens``, ``ts``, ``until``) expiring ``linger_ms`` after they
    are full again; each with its slot records, a sorted set expiring ``linger_ms`` after its
    last slot."""

    def __init__(self, store: RedisStore, *, linger_ms: int = LINGER_MS) -> None:
        self.store = store
        self.linger_ms = linger_ms
        self._take = store.script(_TAKE)
        self._drain = store.script(_DRAIN)
        self._drain_take = store.script(_DRAIN_TAKE)

    def _keys(self, key: str) -> list[str]:
        """The bucket's key and its slot records' key (a script is passed every key it touches)."""
        return [self.store.key("rate:" + key), self.store.key("rate-slots:" + key)]

    def take_many(self, requests: list[TakeRequest]) -> list[Take]:
        """One script call for every request: one round trip, whatever their number."""
        keys: list[str] = []
        args: list[float | int | str] = []
        for r in requests:
            keys += self._keys(r.key)
            args += _take_args(r, self.linger_ms)
        with self.store.errors():
            replies = self._take(keys=keys, args=args)
        return [_reply(reply) for reply in replies]

    def drain_and_take(self, for_ms: int, request: TakeRequest) -> Take:
        r = request
        args = [r.rate, r.burst, for_ms, self.linger_ms, *_take_args(r, self.linger_ms)]
        with self.store.errors():
            (reply,) = self._drain_take(keys=self._keys(r.key), args=args)
        return _reply(reply)

    def peek(self, key: str, rate: float, burst: float) -> Level:
        bucket_key, held_key = self._keys(key)
        with self.store.errors():
            seconds, micros = self.store.client.time()
            now = int(seconds) * 1000 + int(micros) / 1000
            raw = self.store.client.hmget(bucket_key, ["tokens", "ts", "until", "lout", "lend"])
            deferred = int(self.store.client.zcount(held_key, now, "+inf"))
        tokens, ts, *rest = raw
        stored = (
            None
            if tokens is None or ts is None
            else _Bucket(float(tokens), float(ts), *(float(value or 0) for value in rest))
        )
        return _level(_refill(stored, TakeRequest(key, rate, burst, 0, 0), now), deferred)

    def drain(self, key: str, rate: float, burst: float, for_ms: int) -> None:
        with self.store.errors():
            self._drain(keys=self._keys(key), args=[rate, burst, for_ms, self.linger_ms])

    def reset(self, key: str) -> None:
        with self.store.errors():
            self.store.client.delete(*self._keys(key))


def _take_args(r: TakeRequest, linger_ms: int) -> list[float | int | str]:
    slot = -1 if r.slot_ms is None else r.slot_ms
    owner = r.owner or ""  # "": no owner (a message id is never empty)
    return [r.rate, r.burst, r.cost, r.horizon_ms, slot, linger_ms, r.lease, r.lease_ms, owner, r.sleep_ms]


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
