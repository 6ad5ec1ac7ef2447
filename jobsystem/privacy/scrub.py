"""Remove personal data and secrets from anything about to be logged or reported.

One :class:`Scrubber` serves every channel: structlog (as a processor), the standard library's
``logging`` (as a filter), Sentry (over whole events), dead-letter headers, stored tracebacks and
``jobctl``'s output. It removes a value when its key names personal data or a secret
(:mod:`jobsystem.privacy.scrub_keys`: ``email``, ``first_name``, ``client_ip``, ``api_key``... at any
depth, and in ``key=value`` text: :mod:`jobsystem.privacy.scrub_pairs`) and, inside any string,
whatever is recognised by its shape (:mod:`jobsystem.privacy.scrub_text`: email addresses,
credentials, tokens; :mod:`jobsystem.privacy.scrub_numbers`: national identity numbers, cards,
IBANs, phone numbers and IP addresses, each confirmed by ``python-stdnum``, ``phonenumbers`` or
``ipaddress`` before it is removed), and every occurrence of a configured secret (``secrets``:
the passwords of the URLs in the settings).

A removed value becomes ``[label]``; with a ``hash_key`` a personal value becomes
``label:<12 hex digits of HMAC-SHA256>`` instead, so one person's events can still be correlated
without storing who they are. Secrets are never hashed. Scrubbing its own output changes nothing.

Cost: a string is looked at only when a cheap test says it may hold something (an ``@``, five
digits close together, a ``:``...); short strings (event names, loggers, actors) are memoised, and
whole strings that are ids, timestamps or plain numbers are recognised at once. An ordinary
lifecycle event costs a few microseconds. It never raises: odd objects become their scrubbed
``repr``, cycles and deep nesting are cut, very long strings are truncated.
"""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import hashlib
import hmac
import logging
import re
import unicodedata
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import lru_cache, partial
from typing import Any

from jobsystem.privacy import scrub_text as shapes
from jobsystem.privacy.scrub_exceptions import exception_text
from jobsystem.privacy.scrub_extents import value_end
from jobsystem.privacy.scrub_is_value import has_is
from jobsystem.privacy.scrub_keys import (
    DEFAULT_EXACT_KEYS,
    DEFAULT_KEYS,
    DEFAULT_TAIL_KEYS,
    SECRET_LABELS,
    KeyMatcher,
)
from jobsystem.privacy.scrub_numbers import DEFAULT_PHONE_REGIONS, NumberFinder
from jobsystem.privacy.scrub_pairs import key_values

__all__ = ["PLAIN_TYPES", "SHORT_INT", "Scrubber", "exception_text"]

_SCALARS = (int, float, bool, type(None), dt.date, dt.time, dt.timedelta, uuid.UUID, decimal.Decimal)
_UNCHANGED = (*_SCALARS, enum.Enum)
#: Types of values (not subclasses: their repr could say anything) passed through as they are
#: under a key that names nothing (see :meth:`Scrubber.key`); an ``int`` after :meth:`Scrubber.number`.
PLAIN_TYPES = frozenset({int, float, bool, type(None)})
#: Ints of up to 12 digits pass (ids, epoch seconds; 6-16% pass a national check); cards have 13+.
SHORT_INT = 10**12
#: Five digits close together: the least any number worth a look has.
_DIGITS = re.compile(r"\d(?:\D{0,3}\d){4}")
#: A digit, in a text without five digits close together but with a word of a key of a date of
#: birth: a date of birth may be in it, joined to its key by a space, with its year or not (``born
#: 12 March 1985``, ``born 12 March``, ``DOB 12/03``). The word is looked for first: it is rarer,
#: and looking for it costs a line about what looking for a year did before.
_A_DIGIT = re.compile(r"\d")
# Whole strings that cannot hold personal data: ISO dates and timestamps, UUIDs, short numbers.
_SAFE = re.compile(
    r"\d{4}-\d\d-\d\d(?:[T ]\d\d:\d\d(?::\d\d(?:\.\d{1,9})?)?(?:Z|[+\-]\d\d:?\d\d)?)?"
    r"|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
    r"|-?(?:0|[1-9]\d{0,5})(?:\.\d+)?"
)
#: Labels whose values are compared without separators or case when hashed.
_COMPACT_LABELS = frozenset({"phone", "card", "ssn", "iban", "id_number"})


class Scrubber:
    """Replace personal data and secrets in strings and nested data; see the module's docstring.

    Parameters:
      keys: key names (as ``DEFAULT_KEYS``) whose values are removed wherever they appear in a key.
      tail_keys: key names that match only as a key's last word (``client_ip``).
      exact_keys: key names that match only as the whole key (``name``).
      extra_keys: more key names, labelled ``redacted`` (a setting's comma-separated list).
      hash_key: with it, personal values become a stable keyed hash instead of ``[label]``.
      secrets: values removed wherever they appear (passwords of configured URLs); values under
        six characters are ignored (they would remove ordinary words).
      phone_regions: regions whose national phone numbers are looked for.
      max_length: longer strings are truncated first, so a huge payload cannot stall logging.
      max_depth: nesting below this depth is replaced by ``[too deep]``.
    """

    def __init__(
        self,
        *,
        keys: Mapping[str, str] = DEFAULT_KEYS,
        tail_keys: Mapping[str, str] = DEFAULT_TAIL_KEYS,
        exact_keys: Mapping[str, str] = DEFAULT_EXACT_KEYS,
        extra_keys: Iterable[str] = (),
        hash_key: bytes | str | None = None,
        secrets: Iterable[str] = (),
        phone_regions: Sequence[str] = DEFAULT_PHONE_REGIONS,
        max_length: int = 65_536,
        max_depth: int = 32,
    ) -> None:
        self.keys = KeyMatcher(keys, tail_keys, exact_keys, extra_keys)
        self.label_for_key: Callable[[str], str | None] = self.keys.label
        self.numbers = NumberFinder(phone_regions)
        self._value_end = partial(value_end, self.numbers)  # how far a value in key=value text runs
        self._hash_key = hash_key.encode() if isinstance(hash_key, str) else hash_key
        # Longest first: a secret that contains another is removed whole. As NFC, as the text it
        # is looked for in (see _scan_line): a password typed on a Mac may come decomposed.
        normal = {_nfc(s) for s in secrets if len(s) >= 6}
        self._secrets = tuple(sorted(normal, key=len, reverse=True))
        # Key name -> (label, key as scrubbed), filled by key(); read directly by loops over events' keys.
        self.keys_seen: dict[str, tuple[str | None, str]] = {}
        self.max_length = max_length
        self.max_depth = max_depth
        self._cached_scan: Callable[[str], str] = lru_cache(maxsize=4096)(self._scan)

    # --- replacement ---

    def _replace(self, label: str, value: str) -> str:
        if self._hash_key is None or label in SECRET_LABELS:
            return f"[{label}]"
        normal = _nfc(value.strip().lower())  # one person, one hash: composed or decomposed
        if label in _COMPACT_LABELS:
            normal = "".join(c for c in normal if c.isalnum())
        digest = hmac.new(self._hash_key, normal.encode("utf-8", "replace"), hashlib.sha256)
        return f"{label}:{digest.hexdigest()[:12]}"

    def _replace_keyed(self, label: str, value: Any) -> Any:
        if isinstance(value, bool) or value is None:
            return value
        if isinstance(value, str):
            return value if not value or shapes.REPLACEMENT.fullmatch(value) else self._replace(label, value)
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
        size = len(text)
        if size < 6:
            return text
        if size <= 64 and _SAFE.fullmatch(text):
            return text  # ids and timestamps: unique, so not worth a place in the cache
        if size <= 256:
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
        if len(text) > 256 and "\n" in text:
            # A traceback or a multi-line message: line by line, so each finder looks only at the
            # lines its cheap test picks, and lines that repeat (file paths, frames) are memoised.
            return "\n".join([self._text(line) for line in text.split("\n")])
        return self._scan_line(text)

    def _scan_line(self, text: str) -> str:
        # Judged as NFC: a decomposed letter (``e`` + U+0301, from macOS file names, some forms) is
        # no letter to ``isalnum`` or ``\w``, and would end an address or a name where it stands.
        # The result is the normalized text with its replacements (the same text, composed).
        text = _nfc(text)
        replace = self._replace
        if self._secrets:
            text = shapes.known_secrets(text, self._secrets)
        if "@" in text or "://" in text:
            text = shapes.credentials(text)
        if len(text) >= 16:
            text = shapes.secrets(text)
        digits = _DIGITS.search(text) is not None  # a key may be followed by its number after a space
        spaced = digits or (self.keys.has_birth_word(text) and _A_DIGIT.search(text) is not None)
        if spaced or "=" in text or ":" in text or has_is(text):  # ``is`` in any case, as its key
            keyed = key_values(text, self.keys, replace, self._value_end, self._hash_key is not None, spaced)
            digits = digits and (keyed is text or _DIGITS.search(keyed) is not None)
            text = keyed
        if "@" in text:
            text = shapes.emails(text, replace)
        if "%40" in text:
            text = shapes.encoded_emails(text, replace)
        if digits:
            text = self.numbers.sub(text, replace)
        if text.count(":") >= 2:
            text = shapes.ipv6(text, replace)
        return text

    # --- structures ---

    def __call__(self, value: Any) -> Any:
        """``value`` scrubbed: strings, bytes, mappings, lists, tuples, sets and exceptions, at any depth."""
        try:
            return self._value(value, 0, set())
        except Exception:  # never let scrubbing break the caller
            return "[unscrubbable]"

    def number(self, value: int) -> int | str:
        """An ``int`` judged as the string of its digits, whatever its sign (a card number stored
        as one, ``-4111111111111111`` too), else itself."""
        if -SHORT_INT < value < SHORT_INT:
            return value
        scrubbed = self._text(digits := str(abs(value)))  # ``-4111…`` as text is a range's end, not a card
        return value if scrubbed == digits else scrubbed

    def _value(self, value: Any, depth: int, seen: set[int]) -> Any:
        if isinstance(value, str):
            return self._text(value)
        if type(value) is int:
            return self.number(value)
        if isinstance(value, _UNCHANGED):
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
            return self._text(exception_text(value))
        return self._text(_safe_repr(value))

    def _container(self, value: Any, depth: int, seen: set[int]) -> Any:
        if isinstance(value, dict):
            out: dict[Any, Any] = {}
            keys_seen = self.keys_seen
            for key, item in value.items():
                label, shown = keys_seen.get(key) or self._any_key(key, depth, seen)
                if label is not None:
                    out[key] = self._replace_keyed(label, item)
                elif type(item) is str:  # the common cases, without _value's type tests
                    out[shown] = self._text(item)
                elif type(item) in PLAIN_TYPES:
                    short = type(item) is not int or -SHORT_INT < item < SHORT_INT  # not worth a call
                    out[shown] = item if short else self.number(item)
                else:
                    out[shown] = self._value(item, depth, seen)
            return out
        if isinstance(value, tuple) and isinstance(getattr(value, "_fields", None), tuple):
            return self._named_tuple(value, depth, seen)
        items = [self._value(item, depth, seen) for item in value]
        return tuple(items) if isinstance(value, tuple) else items

    def _any_key(self, key: Any, depth: int, seen: set[int]) -> tuple[str | None, Any]:
        """:meth:`key` of a string; any other key judged as a value, as text unless a number or date."""
        if isinstance(key, str):
            return self.key(key)
        if isinstance(key, _UNCHANGED):  # as the renderer writes them (an ISO date, a UUID)
            return None, self.number(key) if type(key) is int else key
        scrubbed = self._value(key, depth, seen)  # JSON keys are text: the renderer refuses a tuple
        return None, scrubbed if type(scrubbed) is str else _safe_repr(scrubbed)

    def _named_tuple(self, value: Any, depth: int, seen: set[int]) -> tuple[Any, ...]:
        """A named tuple judged by its field names, as a mapping would be by its keys (item by
        item, ``Customer(full_name=...)`` would lose them), given back as the plain tuple it was
        logged as before (a JSON array, whatever the type)."""
        scrubbed = self._container(dict(zip(value._fields, value, strict=False)), depth, seen)
        return tuple(scrubbed.values())

    def key(self, key: str) -> tuple[str | None, str]:
        """The label of a key name (``None``: its values are judged by their content only) and the
        name as scrubbed. Memoised: key names come from code."""
        known = self.keys_seen.get(key)
        if known is None:
            # Our replacements name nothing: ``{"[card]": 2}`` (was ``{4111111111111111: 2}``) keeps its 2.
            named = shapes.KEY_REPLACEMENT.sub(" ", key) if "[" in key or ":" in key else key
            known = (self.label_for_key(named), self._text(key))
            if len(self.keys_seen) < 8192:
                self.keys_seen[key] = known
        return known

    def item(self, key: Any, value: Any) -> tuple[Any, Any]:
        """``key`` and ``value`` as :meth:`mapping` scrubs them as one entry of a mapping, for a caller
        that scrubs an event entry by entry (and may keep results). Raises where :meth:`mapping`
        would replace the whole event: that caller must then scrub the event whole."""
        if type(value) is str and type(key) is str:  # the common case, taken as _container takes it
            label, shown = self.key(key)
            if label is None:
                return shown, self._text(value)
        ((shown, scrubbed),) = self._container({key: value}, 1, set()).items()
        return shown, scrubbed

    def mapping(self, event: Mapping[Any, Any]) -> dict[Any, Any]:
        """A scrubbed copy of a mapping (a log event, a Sentry event or breadcrumb). A key need not
        be a string (a dict logged or sent whole may have any): one that is not is judged as a
        value, so the copy's keys are not all strings either."""
        try:
            scrubbed = self._container(event if type(event) is dict else dict(event), 1, set())
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

        Attach it to handlers: its arguments' containers are scrubbed as structures, then
        ``record.msg`` becomes the scrubbed message and ``record.args`` is emptied, so a formatter,
        another handler or Sentry's logging integration sees only that.
        Records from structlog (their message is the event dict) are left to the processor.
        """
        try:
            if not isinstance(record.msg, dict):
                record.args = self._arguments(record.args)
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

    def _arguments(self, args: Any) -> Any:
        """A record's arguments with their dicts, lists, tuples and sets scrubbed as structures
        before they are formatted into text, where a value under ``address`` would no longer sit
        next to its key; other arguments keep their type for the format (``%d``)."""
        if isinstance(args, dict):  # one mapping argument: ``%(name)s`` formats, or ``%s`` of it
            return {key: self._argument(key, value) for key, value in args.items()}
        if isinstance(args, tuple) and any(isinstance(a, _CONTAINERS) for a in args):
            return tuple(self._argument(None, a) for a in args)
        return args

    def _argument(self, key: Any, value: Any) -> Any:
        """One argument: its value replaced under a key that names personal data; a container
        scrubbed as a structure, a set still a set; anything else as it is, for the format
        (``%(path)s`` shows ``str(path)``, not its repr) and the text scrub after it."""
        label = self.key(key)[0] if isinstance(key, str) else None
        if label is not None:
            return self._replace_keyed(label, value)
        if not isinstance(value, _CONTAINERS):
            return value
        scrubbed = self._value(value, 1, set())
        if isinstance(value, set | frozenset) and isinstance(scrubbed, list):
            try:
                return frozenset(scrubbed) if isinstance(value, frozenset) else set(scrubbed)
            except TypeError:  # an item scrubbed into something unhashable
                return scrubbed
        return scrubbed


_CONTAINERS = (dict, list, tuple, set, frozenset)
_RECORD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


def _nfc(text: str) -> str:
    """``text`` in NFC; ASCII text and text already in NFC (nearly all) are only checked."""
    if text.isascii() or unicodedata.is_normalized("NFC", text):
        return text
    return unicodedata.normalize("NFC", text)


def _safe_repr(value: object) -> str:
    try:
        return repr(value)
    except Exception:
        return f"<{type(value).__name__}>"
