"""An exception's class name before its message, in free text: no key (for :mod:`scrub_pairs`).

Python writes an exception as ``Type: message`` (a traceback's last line, ``jobctl status``'s
error line, :func:`~jobsystem.privacy.scrub_exceptions.exception_text`). A class named like a
personal key (``InvalidRecipient``, ``AddressError``, the standard library's
``AddressValueError``) read as a key would lose its message as that key's value:
``InvalidRecipient: [recipient] address is not valid``, ``AddressError: [address]``. Such a word
is a class name, and its message is scrubbed as text like any other, when all of these hold:

- it is written in UpperCamelCase, of two words or more, unquoted, right before ``": "``;
- its first or last word names a fault (``Invalid...``, ``...Error``): ``BillingAddress:`` and
  ``FullName:`` stay keys;
- its key is no secret's (``InvalidToken: ...`` stays a key: a secret has no shape to find it by);
- its message opens with a lower-case word, as the messages of Python and of this project do
  (``street is missing``), and has no digit nor ``@`` on its line: a message that opens as a value
  might (``InvalidName: Ada Lovelace``), or holds what has no shape of its own in free text (a
  phone number, a house number: ``InvalidPhone: number +44 7700 900123 is not valid``), is read
  as before, as that key's value.
"""

from __future__ import annotations

import re

from jobsystem.privacy.scrub_keys import SECRET_LABELS, tokens

__all__ = ["is_exception_name"]

#: A class name: an upper-case letter, then letters and digits.
_CLASS_NAME = re.compile(r"[A-Z][A-Za-z0-9]*")
#: A message as Python and this project write one: it opens with a word of lower-case letters
#: (``'`` and ``-`` among them), and has no digit nor ``@`` up to the line's end.
_PLAIN_MESSAGE = re.compile(r"[a-z][a-z'\-]*(?=[\s,.;:!?)]|\Z)[^\d@\n]*(?:\n|\Z)")
#: First words of a class name that name a fault.
_FAULT_FIRST = frozenset(
    {"invalid", "missing", "bad", "unknown", "malformed", "unexpected", "duplicate", "empty"}
    | {"wrong", "unsupported", "illegal", "incomplete", "undeliverable", "unverified", "no", "not"}
)
#: Last words of a class name that name a fault.
_FAULT_LAST = frozenset(
    {"error", "exception", "warning", "failure", "failed", "fault", "invalid", "rejected", "refused"}
    | {"missing", "denied", "exceeded", "expired", "unavailable", "mismatch", "conflict"}
)


def is_exception_name(text: str, at: int, name: str, label: str, adjacent: bool) -> bool:
    """Whether the key ``name`` (labelled ``label``; ``adjacent``: unquoted, right before the
    separator at ``at``) is an exception's class name before its message; see the module."""
    if not adjacent or label in SECRET_LABELS or text[at : at + 2] != ": ":
        return False
    if not _CLASS_NAME.fullmatch(name):
        return False
    words = tokens(name)
    if len(words) < 2 or (words[0] not in _FAULT_FIRST and words[-1] not in _FAULT_LAST):
        return False
    return _PLAIN_MESSAGE.match(text, at + 2) is not None
