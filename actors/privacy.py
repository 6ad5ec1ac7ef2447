"""The project's one :class:`~middleware.scrub.Scrubber`, configured from settings.

Logs, the middleware stack and Sentry share it, so a key added with ``PII_EXTRA_KEYS`` or a hash
key set with ``PII_HASH_KEY`` applies everywhere at once.
"""

from __future__ import annotations

from functools import cache

from actors.settings import Settings
from middleware.scrub import Scrubber


@cache
def _scrubber(hash_key: str | None, extra_keys: tuple[str, ...]) -> Scrubber:
    return Scrubber(hash_key=hash_key, extra_keys=extra_keys)


def get_scrubber(settings: Settings) -> Scrubber:
    """The scrubber for ``settings`` (one per distinct configuration, shared)."""
    hash_key = settings.pii_hash_key.get_secret_value() if settings.pii_hash_key else None
    return _scrubber(hash_key, settings.pii_extra_keys)
