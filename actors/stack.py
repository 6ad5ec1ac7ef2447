"""The worker's middleware stack, assembled in one place and in one order."""

from __future__ import annotations

from typing import NoReturn

from dramatiq.middleware import (
    AgeLimit,
    Callbacks,
    CurrentMessage,
    Middleware,
    Pipelines,
    ShutdownNotifications,
    TimeLimit,
)

from actors.privacy import get_key_hasher, get_scrubber
from actors.settings import Settings, SettingsError
from actors.startup import configuration_checked
from middleware.dead_letters import DeadLetters, SafeRetries
from middleware.heartbeat import Heartbeat
from middleware.idempotency import Idempotency
from middleware.lifecycle import JobLifecycle
from middleware.metrics import Metrics
from middleware.ratelimit import RateLimits
from middleware.state import StateStore
from middleware.status import Status
from middleware.store_check import StoreCheck
from middleware.stored_tracebacks import ScrubStoredTracebacks
from middleware.watchdog import ThreadWatchdog


def build_middleware(settings: Settings, store: StateStore) -> list[Middleware]:
    """The middleware every worker and sender runs, in the order their ``before_*`` hooks fire
    (``after_*`` hooks run in the reverse order).

    - StoreCheck first: at worker boot it checks that the state store answers and accepts writes
      (``state_store_ready``), warns every few seconds while it does not, and stops the worker
      with exit code 2 when ``STATE_URL`` names a store that will never serve.
    - ThreadWatchdog next: a worker or consumer thread that dies anyway (the consumer dead-letters
      malformed messages before any hook sees them) is replaced and logged; it stops watching as
      soon as shutdown begins, before Dramatiq stops the threads itself.
    - Heartbeat: each worker process writes its record (queues, threads, busy, jobs done) to the
      state store every few seconds for the dashboard; it also declares ``dashboard_args``.
    - JobLifecycle next: its ``before_process_message`` binds the job context before any other
      middleware logs, and its ``after_*`` hooks run last, once Retries has chosen between a retry
      and the dead letters; it also declares ``log_args``.
    - AgeLimit: a message too old to matter goes to the dead letters before any work.
    - TimeLimit: every actor gets ``JOB_TIME_LIMIT_MS`` unless it sets ``time_limit`` itself.
    - ShutdownNotifications, Callbacks, Pipelines: Dramatiq's defaults, unchanged.
    - DeadLetters: counts attempts and builds the record a dead letter carries (final error,
      reason, attempts), which the broker's consumer publishes before acking a failed message.
    - SafeRetries (Dramatiq's Retries, except a retry that cannot be published is redelivered
      instead of lost): exponential backoff with jitter (``min_backoff * 2**n * U[1,2)``), a
      finite number of attempts and a cap below RabbitMQ's ``consumer_timeout`` (settings check it).
    - CurrentMessage: lets actors and helpers (``progress()``) find the message they run for.
    - RateLimits after Retries and before Idempotency: a message waits for its token (sleeping
      briefly or re-enqueued for its slot) *before* it is claimed, so a waiting message holds no
      lease and costs no claim/release round trips, and its re-enqueued copy can never come back
      to find its own claim still held (which would delay it by a whole lease). The price: a
      duplicate delivery spends a token before Idempotency skips it; duplicate sends are dropped
      at send, so only redeliveries pay it. An actor's ``RateLimited`` (upstream 429) is a skip,
      not a failure, so Retries never counts it.
    - Idempotency after them: its ``after_process_message`` runs before Retries' (``after`` hooks
      run in reverse), so a failed run's claim is released before the retry is enqueued, and its
      ``after_skip_message`` releases the claim before RateLimits re-enqueues a job whose upstream
      said "slow down". Its ``before_process_message`` runs after AgeLimit and the rate limit, so
      a message is claimed only when it is about to run.
    - Status after Retries and Idempotency (``JOB_STATUS``): its ``before_process_message`` runs
      only for a message that will run (not for one skipped or deferred before it), and its
      ``after_process_message`` runs before Retries', so it records the failed attempt and then
      sees Retries' re-enqueue as the retry (middleware/attempts.py).
    - Metrics (``PROMETHEUS_PORT``, 0 turns it off) after them, so its timer measures the actor.
    - ScrubStoredTracebacks last: ``before_enqueue`` runs in list order, so it scrubs the
      traceback Retries stored in the options after every other middleware wrote its own, just
      before the body is encoded (Retries publishes from inside its ``after_process_message``, so
      an after-hook would be too late).
    """
    scrubber = get_scrubber(settings)
    key_hasher = get_key_hasher(settings)
    stack: list[Middleware] = [
        StoreCheck(store, setting="STATE_URL", on_misconfigured=_stop_misconfigured),
        ThreadWatchdog(),
        Heartbeat(store),
        JobLifecycle(scrub=scrubber),
        AgeLimit(max_age=settings.job_max_age_ms),
        TimeLimit(time_limit=settings.job_time_limit_ms),
        ShutdownNotifications(),
        Callbacks(),
        Pipelines(),
        DeadLetters(scrub=scrubber.text),
        SafeRetries(
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
            key_hasher=key_hasher,
        ),
        Idempotency(
            store,
            ttl_ms=settings.idempotency_ttl_ms,
            lease_ms=settings.idempotency_lease_ms,
            drop_duplicates=settings.idempotency_drop_duplicates,
            key_hasher=key_hasher,
        ),
    ]
    if settings.job_status:
        stack.append(Status(store, ttl_ms=settings.job_status_ttl_ms, scrub=scrubber.text))
    if settings.prometheus_port:
        from actors.metrics import serve_metrics

        stack.append(Metrics(settings.prometheus_dir, exposition=serve_metrics))
    stack.append(ScrubStoredTracebacks(scrubber.text))
    return stack


def _stop_misconfigured(problem: str) -> NoReturn:
    """A store that will never serve stops the worker like any bad setting: one line, exit code 2."""
    with configuration_checked():
        raise SettingsError([problem])
    raise AssertionError("unreachable: configuration_checked re-raises")
