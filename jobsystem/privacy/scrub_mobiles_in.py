"""When two groups of five digits are an Indian mobile as India writes it (``98765 43210``).

Nearly every 10-digit number from 6 to 9 is a valid Indian mobile, so the shape decides: two groups
of five, the first digit 6 to 9, one space between. A ``-`` between them is a range
(``ports 60000-61000``, ``ids 70001-70500``), and a plural just before them names a list
(``offsets 98304 99328``, ``zip codes 90210 94105``): neither is a phone number. Words that end in
``s`` and may stand before a phone number (``is``, ``has``, ``sms``, ``phones``...) are no list.
"""

from __future__ import annotations

import re

__all__ = ["INDIAN_MOBILE", "after_a_plural"]

#: An Indian mobile as India writes it: no trunk 0, two groups of five, one space between.
INDIAN_MOBILE = re.compile(r"[6-9]\d{4} \d{5}")
#: The word just before a run of digits (a ``:`` or ``=`` may follow it), as its last letters.
_LAST_WORD = re.compile(r"(?<![^\W\d_])([^\W\d_]{3,})[ \t]*[:=]?[ \t]*\Z")
#: Plural-looking words that may introduce one phone number; ``-ss``, ``-us`` and ``-is`` are no plurals.
_NOT_A_LIST = frozenset(
    {"has", "was", "does", "its", "yes", "always", "sms", "mms", "nos", "calls", "texts", "details"}
    | {"phones", "mobiles", "numbers", "contacts", "whatsapps", "cells", "digits"}
)


def after_a_plural(before: str) -> bool:
    """Whether ``before`` (the text before the digits) ends with a plural noun: a list follows."""
    match = _LAST_WORD.search(before)
    if match is None:
        return False
    word = match[1].casefold()
    return word.endswith("s") and not word.endswith(("ss", "us", "is")) and word not in _NOT_A_LIST
