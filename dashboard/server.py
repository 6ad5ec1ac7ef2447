"""``jobctl dashboard``: the dashboard served by uvicorn, with the project's logging.

uvicorn's own logging set-up is not used (``log_config=None``): its records go through the
project's structlog processors and scrubber like every other line. Its access log is off: a
query string may hold a search for an idempotency key (an email address, say); the dashboard
logs each request itself at DEBUG, path without query. The start line names the store by its
setting and kind: every INFO line is a Sentry breadcrumb; the URLs (no password) are at DEBUG.
"""

from __future__ import annotations

import logging
import socket

import uvicorn

from dashboard.app import create_app
from dashboard.auth import Credentials
from dashboard.project import Project, redact_url
from dashboard.queues import HealthSampler
from jobsystem.privacy.outage_lines import log_addresses

__all__ = ["check_bind", "serve"]

logger = logging.getLogger("dashboard")


def check_bind(host: str, port: int) -> None:
    """Bind ``host``:``port`` as uvicorn does (SO_REUSEADDR) and let go at once: OSError when the
    port is in use or the address is not this host's, before anything is announced or started."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))


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
    # By setting and kind (an INFO line is a Sentry breadcrumb); the addresses at DEBUG. The
    # operator who started it reads its own address on the terminal (jobctl's echo, no log line).
    users = ["admin", "viewer"] if viewer else ["admin"]
    logger.info("dashboard_started", extra={"users": users, "store": "STATE_URL", "kind": project.store.kind})
    log_addresses(
        logger,
        "dashboard_started",
        url=f"http://{host}:{port}/",
        rabbitmq=redact_url(settings.rabbitmq_url),
        management=redact_url(settings.management_url),
        state=project.store.label,
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
