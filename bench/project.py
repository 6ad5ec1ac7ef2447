"""This project's stack for the comparison: `import actors` (broker, middleware) and one no-op actor."""

from __future__ import annotations

import os

import dramatiq

import actors  # noqa: F401 - builds the project's broker and middleware


@dramatiq.actor(queue_name=os.environ.get("BENCH_QUEUE", "bench-project"))
def noop() -> None:
    """Do nothing: what is measured is the machinery around it."""
