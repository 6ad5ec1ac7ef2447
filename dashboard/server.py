"""``jobctl dashboard``: the dashboard served by uvicorn, with the project's logging.

uvicorn's own logging set-up is not used (``log_config=None``): its records go through the
project's structlog processors and scrubber like every other line. Its access log is off: a
query string may hold a search for an idempotency key (an email address, say); the dashboard
logs each request itself at DEBUG, path without query. The URLs printed at start carry no
password.
"""

from __future__ import annotations

import logging

import uvicorn

from dashboard.app import create_app
from dashboard.auth import Credentials
from dashboard.project import Project, redact_url
from dashboard.queues import HealthSampler

__all__ = ["serve"]

logger = logging.getLogger("dashboard")


def serve(project: Project, host: str, port: int) -> None:
    """Serve the dashboard until interrupted (the admin password must be set: the caller checks)."""
    settings = project.settings
    admin = settings.dashboard_admin_password
    if admin is None:
        raise ValueError("DASHBOARD_ADMIN_PASSWORD is required")
    viewer = settings.dashboard_viewer_password
    credentials = Credentials(admin.get_secret_value(), viewer.get_secret_value() if viewer else None)
    sampler = HealthSampler(project)
    sampler.start()
    app = create_app(project, credentials, sampler)
    logger.info(
        "dashboard_started",
        extra={
            "url": f"http://{host}:{port}/",
            "users": ["admin", "viewer"] if viewer else ["admin"],
            "rabbitmq": redact_url(settings.rabbitmq_url),
            "management": redact_url(settings.management_url),
            "state": project.store.label,
        },
    )
    try:
        uvicorn.run(
            app,
            host=host,
            port=port,
            log_config=None,
            access_log=False,
            server_header=False,
            proxy_headers=False,
            timeout_graceful_shutdown=5,
        )
    finally:
        sampler.stop()
