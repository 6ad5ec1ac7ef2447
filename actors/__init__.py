"""The package ``dramatiq actors`` imports: settings, logging, broker, middleware, then the actors.

The broker is built and made global *before* any actor module is imported, because ``@actor``
binds to the global broker at declaration time.
"""

from __future__ import annotations

import dramatiq

from actors.broker import build_broker
from actors.logs import configure_logging
from actors.settings import get_settings
from actors.stack import build_middleware
from middleware.state import open_store

settings = get_settings()
configure_logging(settings)
store = open_store(settings.state_url, namespace=settings.state_namespace, timeout=settings.state_timeout)
broker = build_broker(settings, build_middleware(settings, store))
dramatiq.set_broker(broker)

from actors import emails, health, media, reports  # noqa: E402

__all__ = ["broker", "emails", "health", "media", "reports", "settings", "store"]
