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
from middleware.metrics import Metrics
from middleware.state import StateStore
from middleware.status import Status


def build_middleware(settings: Settings, store: StateStore) -> list[Middleware]:
    """The middleware every worker and sender runs, in the order their ``before_*`` hooks fire.

    - AgeLimit first: a message too old to matter is dropped to the dead letters before any work.
    - TimeLimit: every actor gets ``JOB_TIME_LIMIT_MS`` unless it sets ``time_limit`` itself.
    - ShutdownNotifications, Callbacks, Pipelines: Dramatiq's defaults, unchanged.
    - Retries last: exponential backoff with jitter (``min_backoff * 2**n * U[1,2)``), a finite
      number of attempts and a cap below RabbitMQ's ``consumer_timeout`` (settings check it).
    - CurrentMessage: lets actors and helpers find the message they run for.
    - Idempotency after Retries: its ``after_process_message`` then runs *before* Retries'
      (``after`` hooks run in reverse), so a failed run's claim is released before the retry is
      enqueued. Its ``before_process_message`` runs last, after AgeLimit has had its say, so a
      message is claimed only when it is about to run.
    - Status after Retries and Idempotency (``JOB_STATUS``): its ``before_process_message`` runs
      only for a message that will run (not for one skipped or deferred before it), and its
      ``after_process_message`` runs before Retries', so it records the failed attempt and then
      sees Retries' re-enqueue as the retry (middleware/attempts.py).
    - Metrics last (``PROMETHEUS_PORT``, 0 turns it off), for the same reasons, and so its timer
      measures the actor alone.
    """
    stack: list[Middleware] = [
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
        Idempotency(
            store,
            ttl_ms=settings.idempotency_ttl_ms,
            lease_ms=settings.idempotency_lease_ms,
            drop_duplicates=settings.idempotency_drop_duplicates,
        ),
    ]
    if settings.job_status:
        stack.append(Status(store, ttl_ms=settings.job_status_ttl_ms))
    if settings.prometheus_port:
        from actors.metrics import serve_metrics

        stack.append(Metrics(settings.prometheus_dir, exposition=serve_metrics))
    return stack
