"""This project's stack for the comparison: `import actors` (broker, middleware) and no-op actors."""

from __future__ import annotations

import os

import dramatiq

import actors  # noqa: F401 - builds the project's broker and middleware

QUEUE = os.environ.get("BENCH_QUEUE", "bench-project")


@dramatiq.actor(queue_name=QUEUE)
def noop() -> None:
    """Do nothing: what is measured is the machinery around it."""


@dramatiq.actor(actor_name="keyed_noop", queue_name=QUEUE, idempotency_key=lambda i: f"bench-{i}")
def keyed_noop(i: int) -> None:
    """Do nothing under an idempotency key: one claim before, one deferred completion after."""
