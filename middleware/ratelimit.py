"""Per-service token buckets shared by every worker: a job takes its tokens right before it runs,
and waiting for them never spends a retry.

A short wait is slept in the worker thread; a longer one re-enqueues the message for a slot
reserved in the bucket (same message id, retries and idempotency key). The store records the slot
for the message id when it books it, and honours it only for that message id, once: a slot in a
message's options that is not on record (forged by a sender, already used by another copy of the
message, passed, voided by a drain) is ignored and the message takes afresh. An actor whose
upstream says "slow down" raises :class:`RateLimited`. The state store unreachable: the message is
deferred (fail closed), it never runs unmetered. Why slots are reserved, and how far ahead: see
``docs/architecture.md`` ("Rate limits").

Hot buckets are leased: a take that finds its bucket far from empty also takes a few tokens for
this process's threads to spend without a round trip. Bucket plus leases never hold more than
``burst``, so **no window of t seconds starts more than burst + rate * t jobs**, across all
processes, leases or not (``jobsystem.store.buckets``). A lease is at most 1/16 of the burst and
``lease_horizon_ms`` of the rate: a paced bucket (near empty) is never leased and keeps its
accuracy. Unspent tokens are dropped when their lease ends (``jobsystem.runtime.token_leases``).
"""

from __future__ import annotations

import logging
import math
import random
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

import dramatiq
from dramatiq.broker import Broker, MessageProxy
from dramatiq.middleware import SkipMessage

from jobsystem.dramatiq_internals import reject
from jobsystem.limits import Limit, RateLimitConfigError
from jobsystem.privacy.keyhash import KeyHasher
from jobsystem.privacy.outage_lines import log_outage
from jobsystem.runtime.attempts import DeferringSkip
from jobsystem.runtime.coalesce import Coalescer
from jobsystem.runtime.requeue import postpone
from jobsystem.runtime.token_leases import TokenLeases
from jobsystem.store.base import StateStore, StoreUnavailable
from jobsystem.store.buckets import Take, TakeRequest, bucket_backend
from middleware.guard import FailClosed
from middleware.rate_targets import RateTargets, Target
from middleware.slot_priority import SlotPriority

__all__ = ["SLOT", "STORE_WAITS", "RateLimited", "RateLimits"]

logger = logging.getLogger(__name__)

#: Message option carrying the slot a deferred message owns: ``{"bucket": name, "at": ms}``. It is a
#: claim to check, not a credential: the store honours it only while on record for the message id.
SLOT = "rate_limit_slot"
#: Message option counting consecutive deferrals while the state store is down.
STORE_WAITS = "rate_limit_store_waits"


def _slot_of(option: object, bucket: str) -> int | None:
    """The slot a deferred message owns in ``bucket``, if its option names one (else None)."""
    if isinstance(option, dict) and option.get("bucket") == bucket:
        at = option.get("at")
        if isinstance(at, int) and not isinstance(at, bool) and at >= 0:
            return at
    return None


def _log_slot_not_honoured(target: Target, take: Take, slot_ms: int) -> None:
    """The message brought a slot the store did not honour: it took afresh instead."""
    now_ms = take.at_ms - take.wait_ms
    if now_ms > slot_ms:  # back after its slot (its worker died, a hop ran late): a token was lost
        logger.info("rate_limit_slot_missed", extra={"bucket": target.bucket, "late_ms": now_ms - slot_ms})
    else:  # not on record: forged, used by another copy of the message, or voided by a drain/reset
        logger.info("rate_limit_slot_unknown", extra={"bucket": target.bucket, "early_ms": slot_ms - now_ms})


class RateLimited(DeferringSkip):
    """Raise from an actor when the upstream says "slow down" (HTTP 429, ``Retry-After``).

    The job is re-enqueued to run again after at least ``retry_after`` seconds, without spending a
    retry, and its bucket is drained for that long so every worker backs off.

    It is a ``SkipMessage``: Dramatiq's worker handles it like a middleware's skip, so Retries
    never sees it (no retry is counted) and the idempotency claim is released.
    """

    def __init__(self, retry_after: float = 1.0) -> None:
        if not (isinstance(retry_after, int | float) and math.isfinite(retry_after) and retry_after >= 0):
            raise ValueError("retry_after must be a number of seconds, at least 0")
        super().__init__(f"rate limited upstream: retry after {retry_after:g} s")
        self.retry_after = float(retry_after)


#: The answer when a token came from this process's leases (no slot involved: ``at_ms`` is unused).
_FROM_LEASE = Take("run", 0, 0)


class RateLimits(FailClosed):
    """Token buckets per service in a :class:`~jobsystem.store.base.StateStore` (see the module docstring).

    Parameters:
      store: the shared state store.
      limits: service name -> :class:`Limit` (see :func:`parse_limits`).
      wait_ms: the longest wait slept in a worker thread; longer waits re-enqueue the message.
      max_delay_ms: the longest a message is re-enqueued for, and how far ahead slots are reserved.
        A long one costs nothing held: the broker keeps delays past its horizon in RabbitMQ
        (:mod:`jobsystem.rabbitmq.delays`), not in a worker.
      slot_lead_ms: how long before its slot a deferred message is due back (it then sleeps to
        the slot); it covers the lag with which Dramatiq releases delayed messages.
      store_retry_ms, max_store_retry_ms: the delay while the state store is down, doubling.
      config_name: how error messages call the configuration (e.g. the setting that holds it).
      key_hasher: hashes the ``key`` of a ``service:key`` bucket (job data, such as a tenant or a
        recipient) before it becomes a store key, a log field or a message option.
      lease_jobs: the most jobs' tokens a take may lease for this process (0: no leases).
      lease_horizon_ms: a lease holds at most this long's worth of the bucket's rate.
      lease_ms: how long a lease period lasts; unspent leased tokens are dropped at its end.
      lease_buckets: the most buckets this process holds leases for (least recently used dropped).
      slot_priority: the broker priority a message deferred to a slot is re-enqueued with, so it
        comes back ahead of a backlog (the queues' highest; None or 0 for plain queues). It gets
        its own priority back when it runs (:mod:`middleware.slot_priority`).
    """

    def __init__(
        self,
        store: StateStore,
        limits: Mapping[str, Limit],
        *,
        wait_ms: int = 1_000,
        max_delay_ms: int = 86_400_000,
        slot_lead_ms: int = 1_000,
        store_retry_ms: int = 2_000,
        max_store_retry_ms: int = 60_000,
        config_name: str = "the rate limits",
        key_hasher: KeyHasher | None = None,
        lease_jobs: int = 32,
        lease_horizon_ms: int = 50,
        lease_ms: int = 1_000,
        lease_buckets: int = 1_024,
        slot_priority: int | None = None,
    ) -> None:
        if not 0 <= wait_ms < max_delay_ms or not 0 <= slot_lead_ms < max_delay_ms:
            raise ValueError("wait_ms and slot_lead_ms must be at least 0 and below max_delay_ms")
        self.backend = bucket_backend(store)
        self.wait_ms = wait_ms
        self.max_delay_ms = max_delay_ms
        self.slot_lead_ms = slot_lead_ms
        self.defer_base_ms = store_retry_ms
        self.defer_max_ms = max_store_retry_ms
        self.hasher = key_hasher or KeyHasher()
        self.targets = RateTargets(limits, self.hasher, config_name)
        # Takes of concurrent worker threads share round trips (see jobsystem.runtime.coalesce).
        self.takes: Coalescer[TakeRequest, Take] = Coalescer(self.backend.take_many)
        self._local = threading.local()
        if lease_jobs < 0 or lease_horizon_ms < 0 or lease_ms <= 0:
            raise ValueError("lease_jobs and lease_horizon_ms must be at least 0, lease_ms above 0")
        self.lease_jobs = lease_jobs
        self.lease_horizon_ms = lease_horizon_ms
        self.lease_ms = lease_ms
        self.leases = TokenLeases(lease_buckets)
        self.priority = SlotPriority(slot_priority)

    defer_option = STORE_WAITS

    @property
    def actor_options(self) -> set[str]:
        return {"rate_limit", "rate_limit_cost"}

    # -- configuration ---------------------------------------------------------------------------

    def before_declare_actor(self, broker: Broker, actor: dramatiq.Actor[Any, Any]) -> None:
        """Refuse an actor whose static ``rate_limit`` names an unknown service or whose cost its
        bucket could never hold: a typo fails at start, not on the first job."""
        option = actor.options.get("rate_limit")
        if option is None:
            if "rate_limit_cost" in actor.options:
                raise RateLimitConfigError(f"actor {actor.actor_name!r}: rate_limit_cost without rate_limit")
            return
        if callable(option):
            return
        if not isinstance(option, str) or not option:
            raise RateLimitConfigError(
                f"actor {actor.actor_name!r}: rate_limit must be a service name or a callable"
            )
        limit = self.targets.limit_of(option)
        if limit is None:
            raise RateLimitConfigError(self.targets.unknown(actor.actor_name, option))
        try:
            self.targets.check_cost(actor.options.get("rate_limit_cost", 1), limit)
        except ValueError as exc:
            raise RateLimitConfigError(f"actor {actor.actor_name!r}: {exc}") from None

    # -- run -------------------------------------------------------------------------------------

    def before_process_message(self, broker: Broker, message: MessageProxy) -> None:
        self._local.target = None
        try:
            target = self.targets.of(broker, message)
        except Exception as exc:
            # Nothing silent: an unusable bucket (or a rate_limit callable that raised)
            # dead-letters the message with the error, which is also logged.
            logger.error(
                "rate_limit_invalid",
                extra={"actor": message.actor_name, "message_id": message.message_id, "error": str(exc)},
            )
            reject(message, "rejected", error=exc)
            raise SkipMessage("unusable rate limit") from None
        if target is None:
            return
        self._local.target = target
        slot_ms = _slot_of(message.options.get(SLOT), target.bucket)
        # A message back for its slot may arrive up to slot_lead_ms early: it sleeps to its slot.
        # The store records a slot only for a longer wait (a deferral), so the two must agree.
        longest_sleep = self.wait_ms if slot_ms is None else max(self.wait_ms, self.slot_lead_ms)
        take = self._take(broker, message, target, slot_ms, longest_sleep)
        if slot_ms is not None and take.at_ms != slot_ms:
            _log_slot_not_honoured(target, take, slot_ms)
        if take.status == "run":
            self.priority.restore(message)
            return
        if take.status == "wait" and take.wait_ms <= longest_sleep:
            logger.info("rate_limited", extra=self._event(target, take, "wait"))
            self.priority.restore(message)
            time.sleep(take.wait_ms / 1000)
            return
        self._postpone(broker, message, target, take, "deferred")
        raise SkipMessage("rate limited: deferred")

    def _take(
        self, broker: Broker, message: MessageProxy, target: Target, slot_ms: int | None, sleep_ms: int
    ) -> Take:
        """A token from this process's leases, else from the store (asking for a lease with it); a
        wait longer than ``sleep_ms`` is a deferral, its slot recorded for the message id."""
        if slot_ms is None and self.leases.spend(target.bucket, target.cost):
            return _FROM_LEASE
        request = TakeRequest(
            target.bucket,
            target.limit.rate,
            target.limit.burst,
            target.cost,
            self.max_delay_ms,
            slot_ms,
            self._lease_size(target) if slot_ms is None else 0.0,
            self.lease_ms,
            owner=message.message_id,
            sleep_ms=sleep_ms,
        )
        sent = time.monotonic()  # before the store starts the lease: it ends here no later
        try:
            take = self.takes.call(request)
        except StoreUnavailable as exc:
            log_outage(logger, logging.WARNING, "rate_limit_store_unavailable", exc, bucket=target.bucket)
            self.defer(broker, message, reason="store_unavailable")
        if take.leased > 0:
            self.leases.add(target.bucket, take.leased, sent + take.lease_left_ms / 1000)
        return take

    def _lease_size(self, target: Target) -> float:
        """The tokens to ask on lease: whole jobs' worth, at most a sixteenth of the burst and
        ``lease_horizon_ms`` of the rate (0 when that is less than one job)."""
        limit = target.limit
        jobs = min(
            self.lease_jobs,
            limit.burst / 16 / target.cost,
            limit.rate * self.lease_horizon_ms / 1000 / target.cost,
        )
        return math.floor(jobs) * target.cost if jobs >= 1 else 0.0

    def _postpone(
        self, broker: Broker, message: MessageProxy, target: Target, take: Take, action: str
    ) -> None:
        """Re-enqueue ``message`` for its slot (``wait``) or to ask again later (``refused``)."""
        if take.status == "wait":
            # Due back slot_lead_ms before the slot; a slot beyond max_delay_ms takes two hops. It
            # comes back ahead of the queue's backlog (promoted), or the backlog could make it late.
            delay = min(max(0, take.wait_ms - self.slot_lead_ms), self.max_delay_ms)
            slot: dict[str, Any] | None = {"bucket": target.bucket, "at": take.at_ms}
            priority = self.priority.promoted(message.options)
        else:
            # Refused: the bucket's slots are booked max_delay_ms ahead. Spread the re-checks of the
            # backlog over time instead of bringing them back together.
            delay = min(self.max_delay_ms, take.wait_ms + random.randint(0, self.max_delay_ms // 2))
            slot = None
            priority = self.priority.restored(message.options)
        logger.info("rate_limited", extra={**self._event(target, take, action), "delay_ms": delay})
        options = {SLOT: slot, STORE_WAITS: 0, **priority}
        postpone(broker, message, delay, reason="rate_limited", options=options)

    @staticmethod
    def _event(target: Target, take: Take, action: str) -> dict[str, Any]:
        return {
            "service": target.service,
            "bucket": target.bucket,
            "wait_ms": take.wait_ms,
            "action": action,
        }

    def after_skip_message(self, broker: Broker, message: MessageProxy) -> None:
        """An actor raised :class:`RateLimited`: drain its bucket and re-enqueue it, retries untouched.

        Dramatiq emits this hook from inside its ``except SkipMessage`` block, so the exception
        being handled is the one the actor (or a middleware) raised. Dramatiq acks a skipped
        message, so the re-enqueue must happen whatever the store answers: a store that fails
        costs the drain (the other workers are not told to back off), never the message.
        """
        raised = sys.exc_info()[1]
        target: Target | None = getattr(self._local, "target", None)
        self._local.target = None
        if not isinstance(raised, RateLimited) or message.failed:
            return
        self._local.upstream = message  # until re-enqueued; see after_hook_failed
        # Waits longer than max_delay_ms are not kept: the job would wait no longer, and an
        # epoch timestamp passed as seconds would otherwise drain the bucket for decades.
        pause_ms = math.ceil(min(raised.retry_after * 1000, self.max_delay_ms))
        if target is not None:
            self.leases.drop(target.bucket)  # the upstream wants less: no more jobs from leases
            try:
                # One round trip: drain for the pause, then take the slot after it (recorded for
                # the message: it is always deferred, never slept).
                limit, owner = target.limit, message.message_id
                request = TakeRequest(
                    target.bucket, limit.rate, limit.burst, target.cost, self.max_delay_ms, owner=owner
                )
                take = self.backend.drain_and_take(pause_ms, request)
            except StoreUnavailable as exc:
                log_outage(logger, logging.WARNING, "rate_limit_store_unavailable", exc, bucket=target.bucket)
            else:
                self._postpone(broker, message, target, take, "upstream")
                self._local.upstream = None
                return
        self._requeue_upstream(broker, message, pause_ms, target)
        self._local.upstream = None

    def _requeue_upstream(
        self, broker: Broker, message: MessageProxy, pause_ms: int, target: Target | None
    ) -> None:
        delay = min(pause_ms + random.randint(0, max(100, pause_ms // 10)), self.max_delay_ms)
        logger.info(
            "rate_limited",
            extra={
                "service": target.service if target else None,
                "bucket": target.bucket if target else None,
                "wait_ms": pause_ms,
                "delay_ms": delay,
                "action": "upstream",
            },
        )
        postpone(broker, message, delay, reason="rate_limited", options={SLOT: None})

    def after_hook_failed(self, broker: Broker, message: MessageProxy, hook: str) -> None:
        """A RateLimited message whose hook failed before it was re-enqueued: re-enqueue it now."""
        if getattr(self._local, "upstream", None) is message:
            self._local.upstream = None
            self._requeue_upstream(broker, message, self.defer_base_ms, None)

    def before_worker_shutdown(self, broker: Broker, worker: dramatiq.Worker) -> None:
        """Drop the leased tokens left and say how leases went in this process."""
        self.leases.drop()
        tally = self.leases.tally
        if tally.leased:
            logger.info(
                "rate_limit_leases",
                extra={"leased": tally.leased, "spent": tally.spent, "dropped": tally.dropped},
            )

    def after_worker_boot(self, broker: Broker, worker: dramatiq.Worker) -> None:
        logger.info(
            "rate_limits_configured",
            extra={
                "limits": {
                    name: {"rate": lim.rate, "burst": lim.burst} for name, lim in self.targets.limits.items()
                }
            },
        )
