"""Idempotency keys in the state store: register at send, claim at run, complete or release after.

A key moves through ``pending`` (a message carrying it was sent), ``running`` (a worker holds a
lease on it), and ``done`` (the effect happened; the result is kept). Each transition is one
atomic operation: a Lua script on Redis (one round trip), a ``BEGIN IMMEDIATE`` transaction on
SQLite. Lease times come from the store's clock, so hosts with skewed clocks agree.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Literal

from jobsystem.store.base import Backends, StateStore, StoreUnavailable
from jobsystem.store.redis import RedisStore
from jobsystem.store.redis_replies import ReplyLine


@dataclass(slots=True)  # not frozen: a frozen __init__ sets each field through object.__setattr__
class Claim:
    """The answer to a claim: run it (``claimed``), skip it (``completed``), or wait (``held``)."""

    status: Literal["claimed", "completed", "held"]
    #: For ``held``: milliseconds until the holder's lease lapses.
    wait_ms: int = 0
    #: For ``completed``: the JSON result recorded by the run that completed the key.
    result: str | None = None
    #: The message id first recorded for the key.
    message_id: str | None = None


@dataclass(slots=True)  # made for every job: see Claim
class ClaimRequest:
    """A run claim to make: ``owner`` leases ``key`` for ``lease_ms``; the key lives ``ttl_ms``."""

    key: str
    message_id: str
    owner: str
    lease_ms: int
    ttl_ms: int


@dataclass(frozen=True)
class KeyRecord:
    """What the store knows of one key (for ``lookup``)."""

    state: str
    message_id: str | None
    result: str | None


class IdempotencyBackend(ABC):
    """The key operations, one implementation per store backend."""

    @abstractmethod
    def register(self, key: str, message_id: str, ttl_ms: int) -> str | None:
        """Record ``key`` as pending for ``message_id`` unless it exists; return the existing
        message id when it does (the send is then a duplicate)."""

    def register_many(self, items: list[tuple[str, str, int]]) -> list[str | None]:
        """:meth:`register` for many ``(key, message_id, ttl_ms)`` at once, in order."""
        return [self.register(key, message_id, ttl) for key, message_id, ttl in items]

    @abstractmethod
    def claim_many(self, requests: list[ClaimRequest]) -> list[Claim]:
        """Take each run lease unless its key is done or leased by another owner; in order."""

    def send_claims(self, requests: list[ClaimRequest]) -> Callable[[], list[Claim]]:
        """Make the claims; the returned callable gives their answers (:meth:`claim_many`'s),
        raising what it would have. Here they are made at once; a backend that can leaves the
        answers in flight until they are asked for."""
        try:
            claims = self.claim_many(requests)
        except Exception as exc:
            return failed_claims(exc)
        return lambda: claims

    def claim(self, key: str, message_id: str, owner: str, lease_ms: int, ttl_ms: int) -> Claim:
        """Take the run lease on ``key`` for ``owner`` unless the key is done or leased by another."""
        return self.claim_many([ClaimRequest(key, message_id, owner, lease_ms, ttl_ms)])[0]

    @abstractmethod
    def renew(self, claims: list[tuple[str, str]], lease_ms: int) -> None:
        """Extend the leases of ``(key, owner)`` pairs still held by those owners."""

    @abstractmethod
    def complete_many(self, items: list[tuple[str, str | None, int]]) -> None:
        """Mark each ``(key, result, ttl_ms)`` done with its result, remembered for ``ttl_ms``."""

    @abstractmethod
    def release_many(self, claims: list[tuple[str, str]]) -> None:
        """Give back the leases of ``(key, owner)`` pairs (their runs failed) so a retry can claim
        them; the keys stay pending."""

    @abstractmethod
    def unregister_many(self, items: list[tuple[str, str]]) -> None:
        """Delete each ``(key, message_id)`` still pending as that message's registration: its send
        failed, so the caller's next send of the key must be published, not dropped. A key whose
        job was claimed since (the publish went through after all) is kept."""

    @abstractmethod
    def keep_many(self, items: list[tuple[str, int]]) -> None:
        """Keep each ``(key, ttl_ms)`` at least ``ttl_ms`` from now (never shorter than it is): its
        job waits that long to run again, and a key that expired meanwhile would let a duplicate
        sent in the gap run beside it."""

    @abstractmethod
    def forget_many(self, keys: list[str]) -> None:
        """Delete each key unless it is done: its job was cancelled, so a deliberate re-send runs."""

    @abstractmethod
    def lookup(self, key: str) -> KeyRecord | None:
        """The key's state, or None when it is unknown or expired."""


#: The store's clock in whole milliseconds, as ``now``: the prelude of the claim and renew scripts.
_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

_REGISTER = """
local out = {}
for i, key in ipairs(KEYS) do
  out[i] = redis.call('HGET', key, 'mid') or ''
  if out[i] == '' then
    redis.call('HSET', key, 'state', 'pending', 'mid', ARGV[2 * i - 1])
    redis.call('PEXPIRE', key, ARGV[2 * i])
  end
end
return out
"""

#: The reply is flat, four values per key (a nested table per key costs Redis more to convert).
#: Each lease's end is formatted once per call (Redis formats a number handed to a command with
#: "%.17g", which costs more than the command), and the TTL goes on as it came. A key that exists
#: always has a TTL (every script that creates one sets it), so ``GT`` keeps a longer one.
_CLAIM = """
local out, until_text = {}, {}
for i, key in ipairs(KEYS) do
  local mid, owner, lease, ttl = ARGV[4 * i - 3], ARGV[4 * i - 2], ARGV[4 * i - 1], ARGV[4 * i]
  local h = redis.call('HMGET', key, 'state', 'owner', 'until', 'result', 'mid')
  local n = #out
  mid = h[5] or mid
  if h[1] == 'done' then
    out[n + 1], out[n + 2], out[n + 3], out[n + 4] = 'completed', 0, h[4] or '', mid
  elseif h[1] == 'running' and h[2] ~= owner and tonumber(h[3]) > now then
    out[n + 1], out[n + 2], out[n + 3], out[n + 4] = 'held', tonumber(h[3]) - now, '', mid
  else
    until_text[lease] = until_text[lease] or string.format('%d', now + tonumber(lease))
    redis.call('HSET', key, 'state', 'running', 'owner', owner, 'until', until_text[lease], 'mid', mid)
    if h[1] then redis.call('PEXPIRE', key, ttl, 'GT') else redis.call('PEXPIRE', key, ttl) end
    out[n + 1], out[n + 2], out[n + 3], out[n + 4] = 'claimed', 0, '', mid
  end
end
return out
"""

_RENEW = """
for i, key in ipairs(KEYS) do
  if redis.call('HGET', key, 'owner') == ARGV[i + 1] then
    redis.call('HSET', key, 'until', now + tonumber(ARGV[1]))
  end
end
return 0
"""

_COMPLETE = """
for i, key in ipairs(KEYS) do
  redis.call('HSET', key, 'state', 'done', 'result', ARGV[2 * i - 1])
  redis.call('HDEL', key, 'owner', 'until')
  redis.call('PEXPIRE', key, ARGV[2 * i])
end
return 0
"""

_RELEASE = """
for i, key in ipairs(KEYS) do
  local h = redis.call('HMGET', key, 'state', 'owner')
  if h[1] == 'running' and h[2] == ARGV[i] then
    redis.call('HSET', key, 'state', 'pending')
    redis.call('HDEL', key, 'owner', 'until')
  end
end
return 0
"""

_UNREGISTER = """
for i, key in ipairs(KEYS) do
  local h = redis.call('HMGET', key, 'state', 'mid')
  if h[1] == 'pending' and h[2] == ARGV[i] then redis.call('DEL', key) end
end
return 0
"""

_KEEP = """
for i, key in ipairs(KEYS) do redis.call('PEXPIRE', key, ARGV[i], 'GT') end
return 0
"""

_FORGET = """
for _, key in ipairs(KEYS) do
  if redis.call('HGET', key, 'state') ~= 'done' then redis.call('DEL', key) end
end
return 0
"""


#: Prefix of the keys' store names. ``idem2:`` holds hashed keys only; names under ``idem:`` (Redis)
#: or without a prefix (SQLite) were written in clear by earlier releases (see the README).
KEY_PREFIX = "idem2:"


class RedisIdempotency(IdempotencyBackend):
    """Keys as Redis hashes (``state``, ``mid``, ``owner``, ``until``, ``result``)."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self._register = store.script(_REGISTER)
        self._claim = store.script(_NOW + _CLAIM)
        self._renew = store.script(_NOW + _RENEW)
        self._complete = store.script(_COMPLETE)
        self._release = store.script(_RELEASE)
        self._unregister = store.script(_UNREGISTER)
        self._keep = store.script(_KEEP)
        self._forget = store.script(_FORGET)
        self._line: ReplyLine | None = None  # made on the first claims sent ahead

    def _key(self, key: str) -> str:
        return self.store.key(KEY_PREFIX + key)

    def register(self, key: str, message_id: str, ttl_ms: int) -> str | None:
        return self.register_many([(key, message_id, ttl_ms)])[0]

    def register_many(self, items: list[tuple[str, str, int]]) -> list[str | None]:
        """One script call for all the keys: one round trip per bulk send instead of one per message."""
        replies = self._register(
            keys=[self._key(key) for key, _, _ in items],
            args=[a for _, mid, ttl in items for a in (mid, ttl)],
        )
        return [_text(r) for r in replies]

    def claim_many(self, requests: list[ClaimRequest]) -> list[Claim]:
        """One script call for all the requests: one round trip, whatever their number."""
        with self.store.errors():
            replies = self._claim(keys=[self._key(r.key) for r in requests], args=_claim_args(requests))
        return _claims(replies)

    def send_claims(self, requests: list[ClaimRequest]) -> Callable[[], list[Claim]]:
        """The script sent now on a connection of its own; its reply is read when asked for
        (``jobsystem.store.redis_replies``)."""
        if self._line is None:
            self._line = ReplyLine(self.store)
        keys = [self._key(r.key) for r in requests]
        reply = self._claim.send_on(self._line, keys, _claim_args(requests))

        def claims() -> list[Claim]:
            with self.store.errors():
                return _claims(reply())

        return claims

    def renew(self, claims: list[tuple[str, str]], lease_ms: int) -> None:
        if claims:
            with self.store.errors():
                self._renew(keys=[self._key(k) for k, _ in claims], args=[lease_ms, *(o for _, o in claims)])

    def complete_many(self, items: list[tuple[str, str | None, int]]) -> None:
        if items:
            args = [a for _, result, ttl in items for a in (result or "", ttl)]
            with self.store.errors():
                self._complete(keys=[self._key(k) for k, _, _ in items], args=args)

    def release_many(self, claims: list[tuple[str, str]]) -> None:
        if claims:
            with self.store.errors():
                self._release(keys=[self._key(k) for k, _ in claims], args=[o for _, o in claims])

    def unregister_many(self, items: list[tuple[str, str]]) -> None:
        if items:
            with self.store.errors():
                self._unregister(keys=[self._key(k) for k, _ in items], args=[mid for _, mid in items])

    def keep_many(self, items: list[tuple[str, int]]) -> None:
        if items:
            with self.store.errors():
                self._keep(keys=[self._key(k) for k, _ in items], args=[ttl for _, ttl in items])

    def forget_many(self, keys: list[str]) -> None:
        if keys:
            with self.store.errors():
                self._forget(keys=[self._key(k) for k in keys], args=[])

    def lookup(self, key: str) -> KeyRecord | None:
        with self.store.errors():
            state, mid, result = self.store.client.hmget(self._key(key), ["state", "mid", "result"])
        if state is None:
            return None
        return KeyRecord(_text(state) or "", _text(mid), _text(result))


def _claim_args(requests: list[ClaimRequest]) -> list[str | int]:
    return [a for r in requests for a in (r.message_id, r.owner, r.lease_ms, r.ttl_ms)]


def _claims(replies: list[bytes]) -> list[Claim]:
    """The claim script's flat reply, four fields per request, as claims."""
    fields = iter(replies)
    return [
        Claim(_claim_status(status), int(wait), _text(result), _text(mid))
        for status, wait, result, mid in zip(fields, fields, fields, fields, strict=True)
    ]


def failed_claims(exc: Exception) -> Callable[[], list[Claim]]:
    """What gives the answers of claims whose call failed with ``exc``: it raises ``exc``."""
    return partial(_reraise, exc)


def _reraise(exc: Exception) -> list[Claim]:
    raise exc


def _claim_status(value: bytes) -> Literal["claimed", "completed", "held"]:
    status = value.decode()
    if status not in ("claimed", "completed", "held"):  # a reply of the wrong shape
        raise StoreUnavailable(f"unexpected reply {status!r}")
    return status  # type: ignore[return-value]


def _text(value: bytes | str | None) -> str | None:
    if isinstance(value, bytes):
        value = value.decode()
    return value or None


def idempotency_backend(store: StateStore) -> IdempotencyBackend:
    """The key operations for ``store``'s backend."""
    from jobsystem.store.idempotency_sqlite import SqliteIdempotency

    return store.operations(Backends(redis=RedisIdempotency, sqlite=SqliteIdempotency))
