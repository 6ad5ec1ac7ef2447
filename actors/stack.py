"""The worker's middleware stack, assembled in one place and in one order."""

from __future__ import annotations

from dramatiq.middleware import (
    AgeLimit,
    Callbacks,
    CurrentMessage,
    Middleware,
    Pipelines,
    Retries,
    ShutdownNotifications,
    TimeLimit,
)

from actors.settings import Settings
from middleware.idempotency import Idempotency
from middleware.ratelimit import RateLimits
from middleware.state import StateStore


def build_middleware(settings: Settings, store: StateStore) -> list[Middleware]:
    """The middleware every worker and sender runs, in the order their ``before_*`` hooks fire.

    - AgeLimit first: a message too old to matter is dropped to the dead letters before any work.
    - TimeLimit: every actor gets ``JOB_TIME_LIMIT_MS`` unless it sets ``time_limit`` itself.
    - ShutdownNotifications, Callbacks, Pipelines: Dramatiq's defaults, unchanged.
    - Retries last: exponential backoff with jitter (``min_backoff * 2**n * U[1,2)``), a finite
      number of attempts and a cap below RabbitMQ's ``consumer_timeout`` (settings check it).
    - CurrentMessage: lets actors and helpers find the message they run for.
    - RateLimits after Retries and before Idempotency: a message waits for its token (sleeping
      briefly or re-enqueued for its slot) *before* it is claimed, so a waiting message holds no
      lease and costs no claim/release round trips, and its re-enqueued copy can never come back
      to find its own claim still held (which would delay it by a whole lease). The price: a
      duplicate delivery spends a token before Idempotency skips it; duplicate sends are dropped
      at send, so only redeliveries pay it. An actor's ``RateLimited`` (upstream 429) is a skip,
      not a failure, so Retries never counts it.
    - Idempotency last: its ``after_process_message`` runs *first* (``after`` hooks run in
      reverse), so a failed run's claim is released before Retries enqueues the retry, and its
      ``after_skip_message`` releases the claim before RateLimits re-enqueues a job whose upstream
      said "slow down". Its ``before_process_message`` runs last, after AgeLimit and the rate
      limit have had their say, so a message is claimed only when it is about to run.
    """
    return [
        AgeLimit(max_age=settings.job_max_age_ms),
        TimeLimit(time_limit=settings.job_time_limit_ms),
        ShutdownNotifications(),
        Callbacks(),
        Pipelines(),
        Retries(
            max_retries=settings.job_max_retries,
            min_backoff=settings.job_min_backoff_ms,
            max_backoff=settings.job_max_backoff_ms,
        ),
        CurrentMessage(),
        RateLimits(
            store,
            settings.rate_limits,
            wait_ms=settings.rate_limit_wait_ms,
            max_delay_ms=settings.rate_limit_max_delay_ms,
            config_name="RATE_LIMITS",
        ),
        Idempotency(
            store,
            ttl_ms=settings.idempotency_ttl_ms,
            lease_ms=settings.idempotency_lease_ms,
            drop_duplicates=settings.idempotency_drop_duplicates,
        ),
    ]
