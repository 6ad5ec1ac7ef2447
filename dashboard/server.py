"""``jobctl dashboard``: the dashboard served by uvicorn, with the project's logging.

uvicorn's own logging set-up is not used (``log_config=None``): its records go through the
project's structlog processors and scrubber like every other line. Its access log is off: a
query string may hold a search for an idempotency key (an email address, say); the dashboard
logs each request itself at DEBUG, path without query. The start line names the store by its
setting and kind: every INFO line is a Sentry breadcrumb; the URLs (no password) are at DEBUG.

The listening socket is bound once, here (:func:`bind_listener`), before anything is announced,
and uvicorn serves on that very socket: a port checked free and then bound again by uvicorn could
be taken by another process in between, and the operator then read uvicorn's own bind error.
"""

from __future__ import annotations

import logging
import socket
import sys

import uvicorn
from starlette.applications import Starlette

from dashboard.app import create_app
from dashboard.auth import Credentials
from dashboard.project import Project, redact_url
from dashboard.queues import HealthSampler
from jobsystem.privacy.outage_lines import log_addresses

__all__ = ["bind_listener", "serve"]

logger = logging.getLogger("dashboard")

#: uvicorn's own backlog (``--backlog``), the same as it gives a socket it binds itself.
BACKLOG = 2048
#: uvicorn's exit code for a server that did not start (``uvicorn.server.STARTUP_FAILURE``).
STARTUP_FAILURE = 3


def bind_listener(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port`` and listening, with uvicorn's options (SO_REUSEADDR;
    IPv6 for a host with a ``:``). OSError when the port is in use or the address is not this
    host's, before anything is announced. Listening at once keeps the port: Linux lets another
    SO_REUSEADDR socket bind a port no socket listens on yet."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(BACKLOG)
    except BaseException:
        listener.close()
        raise
    return listener


def serve(project: Project, listener: socket.socket, host: str, port: int) -> None:
    """Serve the dashboard on ``listener`` (:func:`bind_listener` of ``host``:``port``) until
    interrupted, and close it whatever happens (the admin password must be set: the caller checks)."""
    with listener:
        settings = project.settings
        admin = settings.dashboard_admin_password
        if admin is None:
            raise ValueError("DASHBOARD_ADMIN_PASSWORD is required")
        viewer = settings.dashboard_viewer_password
        credentials = Credentials(admin.get_secret_value(), viewer.get_secret_value() if viewer else None)
        sampler = HealthSampler(project)
        sampler.start()
        try:
            app = create_app(project, credentials, sampler)
            # By setting and kind (an INFO line is a Sentry breadcrumb); the addresses at DEBUG. The
            # operator who started it reads its own address on the terminal (jobctl's echo, no log line).
            users = ["admin", "viewer"] if viewer else ["admin"]
            logger.info(
                "dashboard_started", extra={"users": users, "store": "STATE_URL", "kind": project.store.kind}
            )
            log_addresses(
                logger,
                "dashboard_started",
                url=f"http://{host}:{port}/",
                rabbitmq=redact_url(settings.rabbitmq_url),
                management=redact_url(settings.management_url),
                state=project.store.label,
            )
            run_uvicorn(app, listener)
        finally:
            sampler.stop()


def run_uvicorn(app: Starlette, listener: socket.socket) -> None:
    """What ``uvicorn.run`` does for one process, on ``listener`` rather than on a socket of its
    own; exit code 3, as ``uvicorn.run``, when the server did not start."""
    config = uvicorn.Config(
        app,
        log_config=None,
        access_log=False,
        server_header=False,
        proxy_headers=False,
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    server.run(sockets=[listener])
    if not server.started:
        sys.exit(STARTUP_FAILURE)
