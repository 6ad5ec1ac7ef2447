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

**Slots on record.** A ``wait`` the caller will not sleep through (longer than its ``sleep_ms``) is
a deferral: the slot is recorded for its ``owner`` (the message id) in the same atomic step that
books it. A caller that comes back with that slot (``slot_ms``, same ``owner``) is told to wait
for it or run without taking again, and the record is consumed when the caller is told to run or
to sleep through the rest of the wait: a slot is honoured for the message it was issued to, once.
A slot not on record (forged in a message's options, already used by another copy of the
message, passed, voided by a drain or a reset) is ignored: the caller takes afresh as if it
brought none. So every run is paid for by exactly one token, whatever the messages carry; a
token booked for a slot that is never used is lost, which errs on the side of the upstream's
quota. Records live next to their bucket and are deleted once their slot has passed; a take
without a slot that answers ``run`` never reads or writes them.

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

Redis (``jobsystem.store.buckets_redis``): one Lua script for any number of takes (one round trip
for a whole coalesced batch). SQLite (``jobsystem.store.buckets_sqlite``): the same arithmetic in
Python, written once below, inside one ``BEGIN IMMEDIATE`` transaction.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Literal

from jobsystem.store.base import Backends, StateStore

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
    #: Who a deferral's slot is recorded for and who may bring it back (a message id), or None:
    #: then no slot is recorded and none is honoured.
    owner: str | None = None
    #: The longest wait the caller sleeps through in its thread: a longer one is a deferral, whose
    #: slot is recorded; an honoured slot's record is consumed when its wait is no longer.
    sleep_ms: int = 0


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


def _live_slot(bucket: _Bucket, request: TakeRequest, now: float) -> int | None:
    """The slot ``request`` brings back if it could still be honoured (an owner brings it, it has
    not passed, the bucket was not drained past it); whether it is on record is the backend's to say."""
    slot = request.slot_ms
    if slot is None or not request.owner or slot < 0 or slot < now or slot < bucket.blocked_until:
        return None
    return slot


def _honour(slot: int, now: float) -> Take:
    """The answer to a caller back with its slot on record: wait for it, or run."""
    wait = math.ceil(slot - now)
    return Take("run" if wait == 0 else "wait", wait, slot)


def _recorded(take: Take, request: TakeRequest) -> bool:
    """Whether ``take``'s slot is a deferral to record for ``request.owner``."""
    return take.status == "wait" and bool(request.owner) and take.wait_ms > request.sleep_ms


def _take(bucket: _Bucket, request: TakeRequest, now: float) -> tuple[Take, bool]:
    """A fresh take's answer and whether ``bucket`` changed (SQLite's twin of the Lua script)."""
    slot = request.slot_ms
    wait_f = 0.0 if bucket.tokens >= request.cost else (request.cost - bucket.tokens) * 1000 / request.rate
    if wait_f > request.horizon_ms:
        again = wait_f - request.horizon_ms
        return Take("refused", math.ceil(again), math.ceil(now + again)), False
    bucket.tokens -= request.cost
    wait = math.ceil(wait_f)
    if wait == 0 and (slot is None or slot < 0):  # as the script, where -1 means "no slot"
        leased, left = _lease(bucket, request, now)
        return Take("run", 0, math.ceil(now), leased, left), True
    return Take("run" if wait == 0 else "wait", wait, math.ceil(now + wait_f)), True


def _ttl_ms(bucket: _Bucket, burst: float, rate: float, now: float, linger_ms: int) -> int:
    full_in = (burst - bucket.tokens) * 1000 / rate
    return math.ceil(max(full_in, bucket.blocked_until - now, bucket.lease_end - now, 0.0)) + linger_ms


@dataclass(frozen=True)
class Level:
    """A bucket as it stands (read without taking): ``tokens`` now (negative while slots are
    reserved ahead), the tokens ``reserved`` by waiting jobs, until when it is drained, and how
    many messages are ``deferred`` to a slot on record (not yet back for it)."""

    tokens: float
    reserved: float
    blocked_until_ms: float
    deferred: int = 0


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


def _level(bucket: _Bucket, deferred: int) -> Level:
    return Level(bucket.tokens, max(0.0, -bucket.tokens), bucket.blocked_until, deferred)


def bucket_backend(store: StateStore, *, linger_ms: int = LINGER_MS) -> BucketBackend:
    """The bucket operations for ``store``'s backend; a bucket's state is deleted ``linger_ms``
    after it is full again (the tests shorten it so as not to wait a second)."""
    # Imported here: both backends build on this module's arithmetic and interface.
    from jobsystem.store.buckets_redis import RedisBuckets
    from jobsystem.store.buckets_sqlite import SqliteBuckets

    return store.operations(
        Backends(
            redis=lambda redis: RedisBuckets(redis, linger_ms=linger_ms),
            sqlite=lambda sqlite: SqliteBuckets(sqlite, linger_ms=linger_ms),
        )
    )
