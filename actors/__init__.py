"""The package ``dramatiq actors`` imports: settings, logging, broker, middleware, then the actors.

The broker is built and made global *before* any actor module is imported, because ``@actor``
binds to the global broker at declaration time.
"""

from __future__ import annotations

import dramatiq

from jobsystem.observability.logs import configure_logging
from jobsystem.observability.sentry import configure_sentry
from jobsystem.rabbitmq.broker import build_broker
from jobsystem.settings import get_settings
from jobsystem.stack import build_middleware
from jobsystem.startup import configuration_checked
from jobsystem.store import open_store

with configuration_checked():  # bad settings: one line each and exit code 2 in a worker
    settings = get_settings()
configure_logging(settings)
configure_sentry(settings)  # before the broker: Sentry's Dramatiq integration patches Broker.__init__
store = open_store(settings.state_url, namespace=settings.state_namespace, timeout=settings.state_timeout)
broker = build_broker(settings, build_middleware(settings, store), store)
dramatiq.set_broker(broker)

with configuration_checked():  # an actor's rate_limit that RATE_LIMITS lacks
    from actors import emails, health, media, reports

__all__ = ["broker", "emails", "health", "media", "reports", "settings", "store"]
