"""Log-in, roles and cross-site request protection for the dashboard.

**Log-in**: HTTP basic auth, two users: ``admin`` (``DASHBOARD_ADMIN_PASSWORD``, may act) and
``viewer`` (``DASHBOARD_VIEWER_PASSWORD``, read-only; no viewer without it). Every path asks,
static files included. Name and password are compared as SHA-256 digests with
:func:`hmac.compare_digest`, against both users every time, so neither the time nor the path
taken tells a wrong name from a wrong password, or how much of one matched.

**Cross-site requests**: a browser sends cached basic credentials with any request to the
dashboard's origin, a form posted from another site included; basic auth has no session whose
cookie could carry a token. So every POST must pass three checks, any of which stops a forged one:

1. ``Content-Type: application/json``: an HTML form cannot send it, and a script on another
   origin cannot without a CORS preflight, which the dashboard never answers.
2. ``Origin`` (or, without it, ``Referer``) names the dashboard's own origin, and
   ``Sec-Fetch-Site`` (when the browser sends it) says ``same-origin``.
3. ``X-CSRF-Token`` carries the user's token: an HMAC of the user under a secret drawn at start
   (so a restart changes it), put in every page and given by ``GET /api/csrf``, which another
   origin cannot read. Scripts fetch it once with the same credentials.

A viewer's POST is refused (403) before any of that. Nothing here logs a name or a password.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["Credentials", "User", "cross_site_refusal"]

CSRF_HEADER = "x-csrf-token"


@dataclass(frozen=True)
class User:
    """Who is logged in: ``admin`` acts, ``viewer`` reads."""

    name: str

    @property
    def can_act(self) -> bool:
        return self.name == "admin"


def _digest(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()


class Credentials:
    """The two users' passwords (as digests) and the per-process CSRF secret.

    Parameters:
      admin_password: ``DASHBOARD_ADMIN_PASSWORD``.
      viewer_password: ``DASHBOARD_VIEWER_PASSWORD``, or None (no viewer can log in).
    """

    def __init__(self, admin_password: str, viewer_password: str | None) -> None:
        self._users = [(_digest(b"admin"), _digest(admin_password.encode()), "admin")]
        if viewer_password:
            self._users.append((_digest(b"viewer"), _digest(viewer_password.encode()), "viewer"))
        self._secret = os.urandom(32)
        self._refusals: dict[str, float] = {}

    def authenticate(self, header: str | None) -> User | None:
        """The user an ``Authorization: Basic ...`` header proves, or None."""
        if not header or header[:6].lower() != "basic ":
            return None
        try:
            name, _, password = base64.b64decode(header[6:].strip(), validate=True).partition(b":")
        except (binascii.Error, ValueError):
            return None
        name_digest, password_digest = _digest(name), _digest(password)
        found = None
        for user_digest, secret_digest, role in self._users:  # every user, every time
            same_name = hmac.compare_digest(name_digest, user_digest)
            same_password = hmac.compare_digest(password_digest, secret_digest)
            if same_name & same_password:
                found = role
        return User(found) if found else None

    def csrf_token(self, user: User) -> str:
        """The token ``user``'s POSTs must carry (the same for the life of this process)."""
        return hmac.new(self._secret, b"csrf:" + user.name.encode(), hashlib.sha256).hexdigest()[:40]

    def token_matches(self, user: User, token: str | None) -> bool:
        return token is not None and hmac.compare_digest(token.encode(), self.csrf_token(user).encode())

    def should_log_refusal(self, client: str, every_s: float = 60.0) -> bool:
        """Whether a refused log-in from ``client`` is worth a log line (one a minute per client)."""
        now = time.monotonic()
        if now - self._refusals.get(client, -every_s) < every_s:
            return False
        if len(self._refusals) > 10_000:
            self._refusals.clear()
        self._refusals[client] = now
        return True


def _origin_host(url: str) -> str:
    return urlsplit(url).netloc.lower()


def cross_site_refusal(
    *,
    host: str,
    content_type: str | None,
    origin: str | None,
    referer: str | None,
    fetch_site: str | None,
    token_ok: bool,
) -> str | None:
    """Why a POST must be refused as possibly cross-site, or None when it passes every check."""
    if (content_type or "").split(";")[0].strip().lower() != "application/json":
        return "a POST must be JSON (Content-Type: application/json)"
    # The host only, not the scheme: behind the TLS proxy the README recommends, the browser's
    # origin is https while the server sees http. The token and Sec-Fetch-Site still hold.
    claimed = origin if origin and origin != "null" else referer
    if origin == "null" or (claimed and _origin_host(claimed) != host.lower()):
        return "the request comes from another origin"
    if fetch_site and fetch_site not in ("same-origin", "none"):
        return "the browser says the request is cross-site"
    if not token_ok:
        return "missing or wrong X-CSRF-Token (GET /api/csrf gives it)"
    return None
