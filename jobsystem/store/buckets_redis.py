"""Token buckets in Redis: one Lua script per compound operation (atomic, one round trip for a
whole coalesced batch of takes), the twin of the arithmetic in ``jobsystem.store.buckets``, where
the contract is described. A bucket is a hash (``tokens``, ``ts``, ``until``, and its lease
period) expiring ``linger_ms`` after it is full again.
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
