"""What after a key written in words and `` is `` is its value (``passport number is X1234567``).

`` is `` joins a key to its value less surely than ``:`` or ``=``: ``phone number is missing``,
``the card number is 16 digits long``, ``api key is 32 characters`` are remarks about a value,
not the value. The rule: after `` is ``, a value is taken only when it reads as an identifier —
three digits or more in its first word and the groups of digits after it (``555 0134``,
``219 09 9999``), or two digits or more among letters in its first word (``X1234567``,
``1234567FA``) — and no unit follows its last digit (``100 characters``, ``10-15 digits``,
``16-digit``, ``256 bits``, ``100%``).
"""

from __future__ import annotations

import re

__all__ = ["reads_as_identifier"]

#: The value's first word (after spaces), and the groups of digits one space after it (``0134``).
_RUN = re.compile(r"[ \t]*(\S+)((?:[ \t]\d+(?:[\-./]\d+)*(?!\S))*)")
#: A unit after a number's last digit: the number is a length, not a value. (``long`` and ``short``
#: are none: after a count of two digits they are a remark already, after an identifier a word.)
_UNIT = re.compile(
    r"[ \t\-]*(?:(?:digits?|char(?:acter)?s?|letters?|symbols?|bytes?|bits?)(?![^\W\d_])|%)",
    re.IGNORECASE,
)


def reads_as_identifier(text: str, pos: int) -> bool:
    """Whether the text at ``pos``, after a key in words and `` is ``, reads as an identifier by
    the module's rule: a length (``16 digits long``) or a remark (``missing``) is no value."""
    run = _RUN.match(text, pos)
    if run is None:
        return False
    word, groups = run[1], run[2]
    digits = sum(c.isdigit() for c in word)
    if digits == 0:
        return False  # ``missing``, ``required``: the common remark, kept cheap
    mixed = digits >= 2 and any(c.isalpha() for c in word)
    if not mixed and digits + sum(c.isdigit() for c in groups) < 3:
        return False  # ``3 digits short``, ``10 or 11 digits``, ``16 long``, ``16, got 15``: a count
    last = run.end() if groups else run.start(1) + max(i for i, c in enumerate(word) if c.isdigit()) + 1
    return _UNIT.match(text, last) is None
