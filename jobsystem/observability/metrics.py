"""The worker's Prometheus endpoint: the function Dramatiq forks to serve it, configured from settings.

It lives here, not in ``middleware/``, because the fork process starts from the ``dramatiq`` main
process, which has not imported the project: importing this module (and so ``actors``) is how it
learns its settings.
"""

from __future__ import annotations

from jobsystem.settings import get_settings
from middleware.metrics import serve


def serve_metrics() -> int:
    """Serve ``/metrics`` on ``PROMETHEUS_HOST:PROMETHEUS_PORT``: the group's counters, queue depths."""
    from actors.health import queue_depths  # needs the built broker: import at call time

    settings = get_settings()
    return serve(
        settings.prometheus_dir,
        settings.prometheus_host,
        settings.prometheus_port,
        lambda queues: queue_depths(settings, queues),
    )
