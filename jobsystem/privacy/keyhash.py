"""Store keys built from job data, hashed so that the store's key names carry no personal data.

An idempotency key (``send_email:ana@example.com|welcome||``) or a per-recipient rate-limit bucket
would otherwise be readable by anyone who can list the state store's keys (Redis ``SCAN``, the
SQLite file). The part that comes from job data is replaced by the first 128 bits of its
HMAC-SHA256 under a secret, the same in every process that shares the store, so a key looked up
at send, at run or by an operator (``Idempotency.lookup``) lands on the same name.

Without a secret the hash is still taken, under a fixed public key: names are no longer
readable, but someone who can list them can test guesses (a list of email addresses) against
them. :attr:`KeyHasher.keyed` tells which; the worker warns at start when it is False.
"""

from __future__ import annotations

import hashlib
import hmac
import unicodedata

__all__ = ["KeyHasher"]

#: The key used when no secret is configured (public: it hides names, it does not protect them).
UNKEYED = b"jobsystem: store keys without a secret"

#: How many recent texts keep their hash in memory (each is in a message this process holds).
RECENT_KEYS = 4096


class KeyHasher:
    """``hasher(text)``: 32 hex digits of HMAC-SHA256 of ``text`` under ``secret``.

    Parameters:
      secret: the secret shared by every process using the store; None hashes without one.
    """

    def __init__(self, secret: bytes | str | None = None) -> None:
        self.keyed = bool(secret)
        key = secret.encode() if isinstance(secret, str) else secret
        # Keyed once: each text then costs a copy of the keyed state, not a fresh HMAC set-up
        # (``hmac.digest`` takes ~1.3 us with OpenSSL 3 here, a copy ~0.8 us; same digest).
        self._keyed = hmac.new(key or UNKEYED, digestmod=hashlib.sha256)
        self._recent: dict[str, str] = {}

    def __call__(self, text: str) -> str:
        """The hash of ``text``'s NFC form: one key typed decomposed (macOS) and composed (Linux)
        is one name. ASCII text, the common case, is its own NFC form and is not looked at."""
        # The same texts come back (a tenant's bucket on every job, a key hashed again at start
        # when no claim was made at receipt): those are a dict lookup. The cache is emptied when full
        # rather than kept in order (cheaper).
        hashed = self._recent.get(text)
        if hashed is None:
            mac = self._keyed.copy()
            one_form = text if text.isascii() else unicodedata.normalize("NFC", text)
            mac.update(one_form.encode("utf-8", "surrogatepass"))
            hashed = mac.hexdigest()[:32]
            if len(self._recent) >= RECENT_KEYS:
                self._recent.clear()
            self._recent[text] = hashed
        return hashed
