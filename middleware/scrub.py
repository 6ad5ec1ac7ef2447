"""Remove personal data and secrets from anything about to be logged or reported.

One :class:`Scrubber` serves three callers: structlog (as a processor), the standard library's
``logging`` (as a filter) and Sentry (over whole events). It removes a value when its key names
personal data or a secret (``email``, ``first_name``, ``api_key``... at any depth) and, inside any
string, whatever looks like an email address, phone number, payment card (Luhn-checked), US SSN,
IBAN (mod-97-checked), bearer token, JWT, API key or URL password, whatever the key.

A removed value becomes ``[label]``; with a ``hash_key`` a personal value becomes
``label:<12 hex digits of HMAC-SHA256>`` instead, so one person's events can still be correlated
without storing who they are. Secrets are never hashed. Scrubbing its own output changes nothing.

It never raises: odd objects are replaced by their scrubbed ``repr``, cycles and very deep nesting
are cut, very long strings are truncated. Every pattern is precompiled and guarded by a cheap test
(``"@" in text``...), so a string with nothing suspicious costs a few substring checks.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import enum
import hashlib
import hmac
import logging
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from functools import lru_cache
from typing import Any

#: Key names whose values are removed, by label. A key matches when these tokens appear in it in
#: order (``customer_email``, ``firstName``, ``API-Key``), or as one word (``firstname``), or plural.
DEFAULT_KEYS: Mapping[str, str] = {
    # Secrets: replaced, never hashed.
    "password": "password",
    "passwd": "password",
    "pwd": "password",
    "passphrase": "password",
    "secret": "secret",
    "credential": "secret",
    "api_key": "secret",
    "access_key": "secret",
    "private_key": "secret",
    "signing_key": "secret",
    "token": "token",
    "authorization": "authorization",
    "auth": "authorization",
    "cookie": "cookie",
    "session_id": "cookie",
    "cvv": "card",
    "cvc": "card",
    # Personal data: replaced, or hashed with a hash key.
    "email": "email",
    "e_mail": "email",
    "phone": "phone",
    "mobile": "phone",
    "telephone": "phone",
    "fax": "phone",
    "msisdn": "phone",
    "ssn": "ssn",
    "social_security": "ssn",
    "tax_id": "id_number",
    "national_id": "id_number",
    "passport": "id_number",
    "card": "card",
    "card_number": "card",
    "cardholder": "name",
    "iban": "iban",
    "account_number": "account",
    "address": "address",
    "street": "address",
    "postcode": "address",
    "postal_code": "address",
    "zip_code": "address",
    "zipcode": "address",
    "first_name": "name",
    "last_name": "name",
    "full_name": "name",
    "middle_name": "name",
    "given_name": "name",
    "family_name": "name",
    "maiden_name": "name",
    "display_name": "name",
    "customer_name": "name",
    "recipient_name": "name",
    "contact_name": "name",
    "holder_name": "name",
    "surname": "name",
    "username": "name",
    "user_name": "name",
    "birth_date": "birth_date",
    "birthdate": "birth_date",
    "date_of_birth": "birth_date",
    "birthday": "birth_date",
    "dob": "birth_date",
}

#: Keys removed only when they are the whole key: ``name`` alone is a person's name far more
#: often than not, while ``actor_name``, ``queue_name`` or ``template_name`` are not.
DEFAULT_EXACT_KEYS: Mapping[str, str] = {"name": "name"}

#: Labels of secrets: always ``[label]``, never a hash (a hash of a password is still a secret).
SECRET_LABELS = frozenset({"password", "secret", "token", "authorization", "cookie", "redacted"})

#: Label of keys added by configuration (``extra_keys``).
EXTRA_LABEL = "redacted"

_SCALARS = (int, float, bool, type(None), dt.date, dt.time, dt.timedelta, uuid.UUID, decimal.Decimal)
_REPLACEMENT = re.compile(r"\[[a-z_]+\]|[a-z_]+:[0-9a-f]{12}")
_HEX12 = re.compile(r"[0-9a-f]{12}")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_KEY_SPLIT = re.compile(r"[^a-z0-9]+")

# --- Value patterns. Each starts with a literal or a character class (a leading look-behind
# makes Python's regex engine try every position) and runs only when a cheap guard passes.
_URL_PASSWORD = re.compile(r"(?P<head>://[^\s/:@]{0,256}:)(?P<pw>[^\s/@]{1,256})@")
_JWT = re.compile(r"eyJ(?<!\weyJ)[\w\-]{4,}\.eyJ[\w\-]{4,}\.[\w\-]*")
_BEARER = re.compile(r"[Bb](?<!\w[Bb])(?:earer|EARER)\s+[\w\-.~+/]{8,}=*")
_BASIC = re.compile(r"B(?<!\wB)asic\s+(?P<credentials>[A-Za-z0-9+/]{6,}={0,2})")
_KEY_PREFIXES = (
    *("sk_", "pk_", "rk_", "sk-", "AKIA", "AIza", "ghp_", "gho_", "ghu_", "ghs_", "ghr_"),
    *("github_pat_", "xox", "glpat-", "SG."),
)
_PREFIXED_KEY = re.compile(
    r"(?<![\w\-])(?:(?:sk|pk|rk)_(?:live|test)_[A-Za-z0-9]{10,}|sk-[A-Za-z0-9_\-]{20,}|AKIA[0-9A-Z]{16}"
    r"|AIza[\w\-]{35}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_\w{20,}|xox[abposr]-[A-Za-z0-9\-]{10,}"
    r"|glpat-[\w\-]{20,}|SG\.[\w\-]{16,}\.[\w\-]{16,})(?![\w\-])"
)
_GENERIC_SECRET = re.compile(r"[A-Za-z0-9_\-](?<![\w\-][A-Za-z0-9_\-])[A-Za-z0-9_\-]{31,}(?![\w\-])")
_EMAIL_LOCAL = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._%+-")
_EMAIL_DOMAIN = re.compile(r"(?:[^\W_](?:[\w\-]{0,61}[^\W_])?\.){1,8}[^\W\d_]{2,24}\b")
_IBAN = re.compile(r"[A-Z](?<!\w[A-Z])[A-Z]\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,4})?\b")
_CARD = re.compile(r"\d(?<![\d+]\d)(?:[ \-]?\d){12,}(?!\d)")
_DIGITS = re.compile(r"\d+")
_SSN = re.compile(r"\d(?<![\d\-]\d)\d\d(?P<sep>[\- ])\d\d(?P=sep)\d{4}(?![\d\-])")
#: +44 20 7946 0958, 0044 20 7946 0958, +1 (415) 555-0134, +4915112345678.
_PHONE_INTL = re.compile(
    r"[+0](?<![\w+][+0])(?<!\d[ .\-][+0])(?:(?<=\+)|(?<=0)0)[1-9]\d{0,2}"
    r"(?:[ .\-]?(?:\(\d{1,5}\)|\d{1,5})){1,6}(?!\w|[.:]\d)"
)
#: (415) 555-0134, 415-555-0134, 415.555.0134, 1-800-555-0199.
_PHONE_NANP = re.compile(
    r"[(1-9](?<![\w+.\-:][(1-9])(?:(?<=1)[ .\-](?:\([2-9]\d{2}\) ?|[2-9]\d{2}[ .\-])|(?<=\()[2-9]\d{2}\) ?"
    r"|(?<=[2-9])\d{2}[ .\-])\d{3}[ .\-]\d{4}(?![\w\-]|[.:]\d)"
)
#: National numbers with a trunk 0: 020 7946 0958, 07700 900123, 06 12 34 56 78, 030-12345678.
_PHONE_NATIONAL = re.compile(
    r"0(?<![\w+.\-:]0)(?<!\d[ .\-/]0)[1-9]\d{0,4}(?:[ .\-/]?\d{2,8}){1,5}(?![\w\-]|[.:]\d)"
)
_DIGIT_RUN = re.compile(r"\d(?:[ ().\-/]{0,2}\d){6}")
_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
_SEPARATOR = re.compile(r"[:=]")
_VALUE = re.compile(r"\s*(?P<val>\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'|[\"']?[^\s\"',;&(){}\[\]<>]+)")
# Whole strings that cannot hold personal data: ISO dates and timestamps, UUIDs, short numbers.
_SAFE = re.compile(
    r"\d{4}-\d\d-\d\d(?:[T ]\d\d:\d\d(?::\d\d(?:\.\d{1,9})?)?(?:Z|[+\-]\d\d:?\d\d)?)?"
    r"|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
    r"|-?(?:0|[1-9]\d{0,7})(?:\.\d+)?"
)
#: Card number prefixes (issuer identification) and the lengths their cards have.
_CARD_BRANDS = (
    (re.compile(r"4"), (13, 16, 19)),  # Visa
    (re.compile(r"5[1-5]|2(?:2[2-9]|[3-6]|7[01]|720)"), (16,)),  # Mastercard
    (re.compile(r"3[47]"), (15,)),  # American Express
    (re.compile(r"3(?:0[0-5]|[68])"), (14, 16)),  # Diners Club
    (re.compile(r"6(?:011|5|4[4-9])|35|62"), (16, 17, 18, 19)),  # Discover, JCB, UnionPay
)


def _tokens(key: str) -> tuple[str, ...]:
    return tuple(t for t in _KEY_SPLIT.split(_CAMEL.sub("_", key).lower()) if t)


def _luhn(digits: str) -> bool:
    total = 0
    for i, char in enumerate(reversed(digits)):
        n = ord(char) - 48
        if i % 2:
            n = n * 2 - 9 if n > 4 else n * 2
        total += n
    return total % 10 == 0


def _is_card_number(digits: str) -> bool:
    return any(p.match(digits) and len(digits) in lengths for p, lengths in _CARD_BRANDS) and _luhn(digits)


def _iban_valid(iban: str) -> bool:
    if not 15 <= len(iban) <= 34:
        return False
    moved = iban[4:] + iban[:4]
    return int("".join(str(int(c, 36)) for c in moved)) % 97 == 1


class Scrubber:
    """Replace personal data and secrets in strings and nested data; see the module's docstring.

    Args:
      keys: key names (as ``DEFAULT_KEYS``) whose values are removed, by label.
      extra_keys: more key names, labelled ``redacted`` (a setting's comma-separated list).
      exact_keys: key names that match only as the whole key (``name``).
      hash_key: with it, personal values become a stable keyed hash instead of ``[label]``.
      max_length: longer strings are truncated first, so a huge payload cannot stall logging.
      max_depth: nesting below this depth is replaced by ``[too deep]``.
    """

    def __init__(
        self,
        *,
        keys: Mapping[str, str] = DEFAULT_KEYS,
        extra_keys: Iterable[str] = (),
        exact_keys: Mapping[str, str] = DEFAULT_EXACT_KEYS,
        hash_key: bytes | str | None = None,
        max_length: int = 65_536,
        max_depth: int = 32,
    ) -> None:
        specs = {_tokens(k): label for k, label in keys.items()}
        specs.update({_tokens(k): EXTRA_LABEL for k in extra_keys if _tokens(k)})
        self._specs = specs
        self._joined = {"".join(t): label for t, label in specs.items()}
        self._exact = {"_".join(_tokens(k)): label for k, label in exact_keys.items()}
        self._widths = sorted({len(t) for t in specs}, reverse=True)
        self._hash_key = hash_key.encode() if isinstance(hash_key, str) else hash_key
        self.max_length = max_length
        self.max_depth = max_depth
        self.label_for_key: Callable[[str], str | None] = lru_cache(maxsize=4096)(self._label_for_key)
        self._cached_scan: Callable[[str], str] = lru_cache(maxsize=4096)(self._scan)

    # --- keys ---

    def _label_for_key(self, key: str) -> str | None:
        """The label of ``key`` if it names personal data or a secret, else None."""
        tokens = _tokens(key)
        if not tokens:
            return None
        exact = self._exact.get("_".join(tokens))
        if exact:
            return exact
        for width in self._widths:
            for start in range(len(tokens) - width + 1):
                window = tokens[start : start + width]
                label = self._specs.get(window)
                if label is None and width == 1:
                    word = window[0]
                    label = (
                        self._joined.get(word)
                        or self._specs.get((word.removesuffix("s"),))
                        or self._specs.get((word.removesuffix("es"),))
                    )
                if label:
                    return label
        return None

    # --- replacement ---

    def _replace(self, label: str, value: str) -> str:
        if self._hash_key is None or label in SECRET_LABELS:
            return f"[{label}]"
        normal = value.strip().lower()
        if label in ("phone", "card", "ssn", "iban"):
            normal = "".join(c for c in normal if c.isalnum())
        digest = hmac.new(self._hash_key, normal.encode("utf-8", "replace"), hashlib.sha256)
        return f"{label}:{digest.hexdigest()[:12]}"

    def _replace_keyed(self, label: str, value: Any) -> Any:
        if isinstance(value, bool) or value is None:
            return value
        if isinstance(value, str):
            return value if not value or _REPLACEMENT.fullmatch(value) else self._replace(label, value)
        if isinstance(value, (int, float)):
            return self._replace(label, str(value))
        return f"[{label}]"

    # --- text ---

    def text(self, text: str) -> str:
        """``text`` with every personal value and secret found in it replaced."""
        try:
            return self._text(text)
        except Exception:  # logging must go on, without the data
            return "[unscrubbable text]"

    def _text(self, text: str) -> str:
        if len(text) < 6:
            return text
        if len(text) <= 256:
            return self._cached_scan(text)  # event names, loggers, actors, queues repeat
        return self._scan(text)

    def _scan(self, text: str) -> str:
        if _SAFE.fullmatch(text):
            return text
        if len(text) > self.max_length:
            # Cut at a space when there is one nearby: half an email address would escape its pattern.
            cut = text.rfind(" ", self.max_length - 256, self.max_length)
            cut = cut if cut > 0 else self.max_length
            text = f"{text[:cut]}...[truncated {len(text) - cut} chars]"
        if "://" in text:
            text = _URL_PASSWORD.sub(self._url_password, text)
        if len(text) >= 16:
            text = self._secrets(text)
        if "=" in text or ":" in text:
            text = self._key_values(text)
        if "@" in text:
            text = self._emails(text)
        if _DIGIT_RUN.search(text):
            text = _IBAN.sub(self._iban, text)
            text = _CARD.sub(self._card, text)
            text = _SSN.sub(self._ssn, text)
            text = _PHONE_INTL.sub(lambda m: self._phone(m, 8, 15), text)
            text = _PHONE_NANP.sub(lambda m: self._phone(m, 10, 11), text)
            text = _PHONE_NATIONAL.sub(lambda m: self._phone(m, 9, 12), text)
        return text

    def _secrets(self, text: str) -> str:
        if "eyJ" in text:
            text = _JWT.sub("[token]", text)
        if "earer" in text or "EARER" in text:
            text = _BEARER.sub(lambda m: m.group().split(None, 1)[0] + " [token]", text)
        if "Basic" in text:
            text = _BASIC.sub(self._basic, text)
        if any(prefix in text for prefix in _KEY_PREFIXES):
            text = _PREFIXED_KEY.sub("[secret]", text)
        if len(text) >= 32:
            text = _GENERIC_SECRET.sub(self._generic_secret, text)
        return text

    def _url_password(self, match: re.Match[str]) -> str:
        if _REPLACEMENT.fullmatch(match["pw"]) or match["pw"] == "***":
            return match.group()
        return f"{match['head']}[password]@"

    def _basic(self, match: re.Match[str]) -> str:
        if not _is_basic_credentials(match["credentials"]):
            return match.group()  # the English word "Basic", not an Authorization header
        return "Basic [token]"

    def _generic_secret(self, match: re.Match[str]) -> str:
        found = match.group()
        letters = sum(c.isalpha() for c in found)
        digits = sum(c.isdigit() for c in found)
        if found.lower() == found or found.upper() == found or digits < 2 or letters < 8:
            return found  # lower-case hex (ids, hashes), constants, words: not a secret
        return "[secret]"

    def _key_values(self, text: str) -> str:
        """Values after a sensitive key named in the text: ``password=x``, ``'email': 'a@b.c'``."""
        parts: list[str] = []
        done = 0
        for separator in _SEPARATOR.finditer(text):
            at = separator.start()
            if at < done:
                continue
            end = at
            while end > done and text[end - 1] in " \t":
                end -= 1
            quoted = end > done and text[end - 1] in "\"'"
            start = end = end - quoted
            while start > done and text[start - 1] in _KEY_CHARS and end - start < 64:
                start -= 1
            label = self.label_for_key(text[start:end]) if start < end else None
            value = _VALUE.match(text, at + 1) if label else None
            if label is None or value is None:
                continue
            own_hash = not quoted and end == at and value.start("val") == at + 1 and text[at] == ":"
            replaced = self._pair_value(label, text[start:end], value["val"], own_hash)
            if replaced is not None:
                parts += (text[done : value.start("val")], replaced)
                done = value.end("val")
        if not parts:
            return text
        parts.append(text[done:])
        return "".join(parts)

    def _pair_value(self, label: str, key: str, value: str, own_hash: bool) -> str | None:
        quote = value[0] if value[0] in "\"'" else ""
        closed = bool(quote) and len(value) > 1 and value.endswith(quote)
        inner = value[1:-1] if closed else value[len(quote) :]
        if not inner.strip() or inner.startswith("[") or _REPLACEMENT.fullmatch(inner):
            return None
        if own_hash and label == key.lower() and _HEX12.fullmatch(inner):
            return None  # our own ``label:hash``
        return f"{quote}{self._replace(label, inner)}{quote if closed else ''}"

    def _emails(self, text: str) -> str:
        parts: list[str] = []
        done = 0
        at = text.find("@")
        while at != -1:
            start = at
            while start > max(done, at - 64) and text[start - 1] in _EMAIL_LOCAL:
                start -= 1
            domain = _EMAIL_DOMAIN.match(text, at + 1) if start < at else None
            if domain is not None:
                parts += (text[done:start], self._replace("email", text[start : domain.end()]))
                done = domain.end()
            at = text.find("@", max(at + 1, done))
        if not parts:
            return text
        parts.append(text[done:])
        return "".join(parts)

    def _iban(self, match: re.Match[str]) -> str:
        compact = match.group().replace(" ", "")
        return self._replace("iban", compact) if _iban_valid(compact) else match.group()

    def _card(self, match: re.Match[str]) -> str:
        run = match.group()
        groups = [(m.start(), m.end()) for m in _DIGITS.finditer(run)]
        # A run may hold more than a card (a date before it, a phone after): try windows of whole
        # digit groups, from the left, and replace the first that is a valid card number.
        for first in range(len(groups)):
            digits = ""
            for last in range(first, len(groups)):
                digits += run[groups[last][0] : groups[last][1]]
                if len(digits) > 19:
                    break
                if len(digits) >= 13 and _is_card_number(digits):
                    begin, end = groups[first][0], groups[last][1]
                    rest = run[end:]
                    tail = _CARD.sub(self._card, rest) if _CARD.search(rest) else rest
                    return run[:begin] + self._replace("card", digits) + tail
        return run

    def _ssn(self, match: re.Match[str]) -> str:
        area, group, serial = _DIGITS.findall(match.group())
        if area in ("000", "666") or area[0] == "9" or group == "00" or serial == "0000":
            return match.group()  # never issued
        return self._replace("ssn", match.group())

    def _phone(self, match: re.Match[str], low: int, high: int) -> str:
        found = match.group()
        digits = sum(c.isdigit() for c in found)
        return self._replace("phone", found) if low <= digits <= high else found

    # --- structures ---

    def __call__(self, value: Any) -> Any:
        """``value`` scrubbed: strings, bytes, mappings, lists, tuples and sets at any depth."""
        try:
            return self._value(value, 0, set())
        except Exception:  # never let scrubbing break the caller
            return "[unscrubbable]"

    def _value(self, value: Any, depth: int, seen: set[int]) -> Any:
        if isinstance(value, str):
            return self._text(value)
        if isinstance(value, (*_SCALARS, enum.Enum)):
            return value
        if isinstance(value, (bytes, bytearray, memoryview)):
            return self._text(bytes(value[: self.max_length + 1]).decode("utf-8", "replace"))
        if depth >= self.max_depth:
            return "[too deep]"
        if isinstance(value, (dict, list, tuple, set, frozenset)):
            if id(value) in seen:
                return "[cycle]"
            seen.add(id(value))
            try:
                return self._container(value, depth + 1, seen)
            finally:
                seen.discard(id(value))
        if isinstance(value, BaseException):
            return self._text(f"{type(value).__name__}: {value}")
        return self._text(_safe_repr(value))

    def _container(self, value: Any, depth: int, seen: set[int]) -> Any:
        if isinstance(value, dict):
            out: dict[Any, Any] = {}
            for key, item in value.items():
                label = self.label_for_key(key) if isinstance(key, str) else None
                if label is not None:
                    out[key] = self._replace_keyed(label, item)
                else:
                    out[self._text(key) if isinstance(key, str) else key] = self._value(item, depth, seen)
            return out
        items = [self._value(item, depth, seen) for item in value]
        return tuple(items) if isinstance(value, tuple) else items

    def mapping(self, event: Mapping[str, Any]) -> dict[str, Any]:
        """A scrubbed copy of a mapping (a log event, a Sentry event or breadcrumb)."""
        try:
            scrubbed = self._container(dict(event), 1, set())
            assert isinstance(scrubbed, dict)
            return scrubbed
        except Exception:
            return {"event": "[unscrubbable event]"}

    # --- adapters ---

    def processor(self, logger: Any, method_name: str, event_dict: Any) -> Any:
        """structlog processor: the event dict, scrubbed. Put it after ``format_exc_info``."""
        return self.mapping(event_dict)

    def filter(self, record: logging.LogRecord) -> bool:
        """``logging`` filter: a record's message (with its arguments) and extras, scrubbed in place.

        Attach it to handlers: ``record.msg`` becomes the scrubbed message and ``record.args`` is
        emptied, so a formatter, another handler or Sentry's logging integration sees only that.
        Records from structlog (their message is the event dict) are left to the processor.
        """
        try:
            if not isinstance(record.msg, dict):
                try:
                    message = record.getMessage()
                except Exception:  # arguments that do not fit the format: keep the format only
                    message = f"{record.msg} [arguments dropped: they do not fit the format]"
                record.msg, record.args = self._text(message), ()
            for key, value in list(vars(record).items()):
                if key not in _RECORD_ATTRS and not key.startswith("_"):
                    label = self.label_for_key(key)
                    scrubbed = self._replace_keyed(label, value) if label else self._value(value, 1, set())
                    setattr(record, key, scrubbed)
        except Exception:  # a bad record must not leak through logging's error path
            record.msg, record.args = "[unscrubbable log record]", ()
        return True


_RECORD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


def _safe_repr(value: object) -> str:
    try:
        return repr(value)
    except Exception:
        return f"<{type(value).__name__}>"


def _is_basic_credentials(encoded: str) -> bool:
    try:
        return b":" in base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except ValueError:
        return False
