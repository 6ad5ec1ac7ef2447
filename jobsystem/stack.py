"""The worker's middleware stack, assembled in one place and in one order.

Why each one sits where it does is in ``docs/architecture.md`` ("The middleware stack"): the order
decides which hook sees a message first, and ``after_*`` hooks run in the reverse order.
"""

from __future__ import annotations

from typing import NoReturn

from dramatiq.middleware import (
    AgeLimit,
    Callbacks,
    CurrentMessage,
    Middleware,
    ShutdownNotifications,
    TimeLimit,
)

from jobsystem.observability.batched_stream import flush_batched_streams
from jobsystem.observability.job_lines import write_job_line
from jobsystem.observability.metrics import serve_metrics
from jobsystem.privacy.keyhash import KeyHasher
from jobsystem.privacy.scrub import Scrubber
from jobsystem.runtime.deferred import DeferredWrites
from jobsystem.settings import Settings, SettingsError
from jobsystem.startup import configuration_checked
from jobsystem.store import StateStore
from jobsystem.store.results import StoreResultBackend
from middleware.cancellation import Cancellation, ForgetCancelledKeys
from middleware.dead_letters import DeadLetters
from middleware.heartbeat import Heartbeat
from middleware.idempotency import Idempotency
from middleware.lifecycle import JobLifecycle
from middleware.metrics import Metrics
from middleware.own_queues import OwnQueues
from middleware.pipelines import QuickPipelines
from middleware.prefetch import Prefetch
from middleware.ratelimit import RateLimits
from middleware.results import StoreResults
from middleware.retries import SafeRetries
from middleware.status import Status
from middleware.store_check import StoreCheck
from middleware.stored_tracebacks import ScrubStoredTracebacks
from middleware.watchdog import ThreadWatchdog
from middleware.workflows import Workflows

__all__ = ["build_middleware"]


def build_middleware(
    settings: Settings, store: StateStore, *, scrubber: Scrubber, key_hasher: KeyHasher
) -> list[Middleware]:
    """The middleware every worker and sender runs, in the order their ``before_*`` hooks fire:
    StoreCheck, ThreadWatchdog, Prefetch (``WORKER_PREFETCH``), OwnQueues, Heartbeat, JobLifecycle,
    AgeLimit, Callbacks, QuickPipelines (Dramatiq's Pipelines), DeadLetters, SafeRetries, CurrentMessage,
    Cancellation, RateLimits, Idempotency, StoreResults, Workflows, Status (``JOB_STATUS``),
    Metrics (``PROMETHEUS_PORT``), ScrubStoredTracebacks, TimeLimit, ShutdownNotifications,
    ForgetCancelledKeys. Their ``after_*`` hooks fire in the reverse order."""
    # One background writer: a job's key completion and its final status leave in one batch.
    writes = DeferredWrites(store)
    stack: list[Middleware] = [
        StoreCheck(store, setting="STATE_URL", on_misconfigured=_stop_misconfigured),
        ThreadWatchdog(),
        Prefetch(settings.worker_prefetch),
        OwnQueues(),
        Heartbeat(store),
        JobLifecycle(scrub=scrubber, flush_logs=flush_batched_streams, write_line=write_job_line),
        AgeLimit(max_age=settings.job_max_age_ms),
        Callbacks(),
        QuickPipelines(),
        DeadLetters(scrub=scrubber.text),
        SafeRetries(
            max_retries=settings.job_max_retries,
            min_backoff=settings.job_min_backoff_ms,
            max_backoff=settings.job_max_backoff_ms,
        ),
        CurrentMessage(),
        Cancellation(store, keep_ms=settings.cancel_ttl_ms),
        RateLimits(
            store,
            settings.rate_limits,
            wait_ms=settings.rate_limit_wait_ms,
            max_delay_ms=settings.rate_limit_max_delay_ms,
            lease_jobs=settings.rate_limit_lease_jobs,
            config_name="RATE_LIMITS",
            key_hasher=key_hasher,
            # Slot holders jump a backlog in their queue (0: plain queues, nothing to promote).
            slot_priority=settings.rabbitmq_max_priority or None,
        ),
        Idempotency(
            store,
            ttl_ms=settings.idempotency_ttl_ms,
            lease_ms=settings.idempotency_lease_ms,
            drop_duplicates=settings.idempotency_drop_duplicates,
            key_hasher=key_hasher,
            writes=writes,
        ),
        StoreResults(StoreResultBackend(store, scrub=scrubber.text), result_ttl=settings.result_ttl_ms),
        Workflows(store, ttl_ms=settings.result_ttl_ms, cancel_ttl_ms=settings.cancel_ttl_ms),
    ]
    if settings.job_status:
        stack.append(
            Status(
                store,
                ttl_ms=settings.job_status_ttl_ms,
                scrub=scrubber.text,
                scrub_value=scrubber,
                writes=writes,
                scheduled_after_ms=settings.delay_horizon_ms,
            )
        )
    if settings.prometheus_port:
        stack.append(Metrics(settings.prometheus_dir, exposition=serve_metrics))
    stack.append(ScrubStoredTracebacks(scrubber.text))
    # Both raise an exception in the job's thread at any moment until their after hooks run: last
    # but one, their deadline starts when the job does and ends before any other after hook, so
    # no guard's hook (a deferral's re-enqueue, a completion) is cut off halfway.
    stack.append(TimeLimit(time_limit=settings.job_time_limit_ms))
    stack.append(ShutdownNotifications())
    stack.append(ForgetCancelledKeys())  # last: a cancelled key is gone before "cancelled" shows
    return stack


def _stop_misconfigured(problem: str) -> NoReturn:
    """A store that will never serve stops the worker like any bad setting: one line, exit code 2."""
    with configuration_checked():
        raise SettingsError([problem])
    raise AssertionError("unreachable: configuration_checked re-raises")
