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

from actors.privacy import get_scrubber
from actors.settings import Settings
from middleware.lifecycle import JobLifecycle
from middleware.stored_tracebacks import ScrubStoredTracebacks


def build_middleware(settings: Settings) -> list[Middleware]:
    """The middleware every worker and sender runs, in the order their ``before_*`` hooks fire.

    - AgeLimit first: a message too old to matter is dropped to the dead letters before any work.
    - TimeLimit: every actor gets ``JOB_TIME_LIMIT_MS`` unless it sets ``time_limit`` itself.
    - ShutdownNotifications, Callbacks, Pipelines: Dramatiq's defaults, unchanged.
    - Retries last: exponential backoff with jitter (``min_backoff * 2**n * U[1,2)``), a finite
      number of attempts and a cap below RabbitMQ's ``consumer_timeout`` (settings check it).
    - CurrentMessage: lets actors and helpers find the message they run for.
    - JobLifecycle first: its ``before_process_message`` binds the job context before any other
      middleware logs, and its ``after_*`` hooks (``emit_after`` runs in reverse) run last, once
      Retries has chosen between a retry and the dead letters; it also declares ``log_args``.
    - ScrubStoredTracebacks last: ``before_enqueue`` runs in list order, so it scrubs the
      traceback Retries stored in the options after every other middleware wrote its own, just
      before the body is encoded (Retries publishes from inside its ``after_process_message``, so
      an after-hook would be too late).
    """
    scrubber = get_scrubber(settings)
    return [
        JobLifecycle(scrub=scrubber),
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
        ScrubStoredTracebacks(scrubber.text),
    ]
