"""The project's one :class:`~jobsystem.privacy.scrub.Scrubber` and one store-key hasher, from settings.

Logs, the middleware stack, Sentry and ``jobctl`` share the scrubber, so a key added with
``PII_EXTRA_KEYS`` or a hash key set with ``PII_HASH_KEY`` applies everywhere at once. It also
knows the secrets the settings hold (the passwords of ``RABBITMQ_URL``, ``RABBITMQ_MANAGEMENT_URL``,
``SMTP_URL`` and ``STATE_URL``, the hash keys and the dashboard's passwords) and removes them
wherever they appear, whatever the text around them looks like.
"""

from __future__ import annotations

import hashlib
import hmac
from functools import cache
from urllib.parse import unquote, urlsplit

from jobsystem.privacy.keyhash import KeyHasher
from jobsystem.privacy.scrub import Scrubber
from jobsystem.settings import Settings

__all__ = ["configured_secrets", "get_key_hasher", "get_scrubber"]


def _url_passwords(url: str) -> list[str]:
    found = []
    for node in url.split(";"):
        try:
            password = urlsplit(node).password
        except ValueError:
            continue
        if password:
            found += [password, unquote(password)]
    return found


def configured_secrets(settings: Settings) -> tuple[str, ...]:
    """Every secret value the settings hold, as written and URL-decoded."""
    found = []
    for url in (
        settings.rabbitmq_url,
        settings.rabbitmq_management_url,
        settings.smtp_url,
        settings.state_url,
    ):
        found += _url_passwords(url)
    for secret in (
        settings.pii_hash_key,
        settings.state_key_secret,
        settings.dashboard_admin_password,
        settings.dashboard_viewer_password,
    ):
        if secret is not None:
            found.append(secret.get_secret_value())
    return tuple(sorted(set(found)))


@cache
def _scrubber(hash_key: str | None, extra_keys: tuple[str, ...], secrets: tuple[str, ...]) -> Scrubber:
    return Scrubber(hash_key=hash_key, extra_keys=extra_keys, secrets=secrets)


def get_scrubber(settings: Settings) -> Scrubber:
    """The scrubber for ``settings`` (one per distinct configuration, shared)."""
    hash_key = settings.pii_hash_key.get_secret_value() if settings.pii_hash_key else None
    return _scrubber(hash_key, settings.pii_extra_keys, configured_secrets(settings))


def get_key_hasher(settings: Settings) -> KeyHasher:
    """The hasher of store keys built from job data: ``STATE_KEY_SECRET``, else a key derived from
    ``PII_HASH_KEY`` (a purpose of its own), else none (names hidden, guesses testable)."""
    if settings.state_key_secret is not None:
        return KeyHasher(settings.state_key_secret.get_secret_value())
    if settings.pii_hash_key is not None:
        derived = hmac.new(settings.pii_hash_key.get_secret_value().encode(), b"state keys", hashlib.sha256)
        return KeyHasher(derived.digest())
    return KeyHasher()
