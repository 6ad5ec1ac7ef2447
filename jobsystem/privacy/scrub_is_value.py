"""Which separators join a key to its value in free text, and what after a weak one is its value.

``:`` and ``=`` join a key to whatever follows it (:mod:`scrub_pairs`). Two weaker ones join a key
only to a value that reads as one:

- `` is ``, in any case (``IS``, ``Is``, ``iS``), after a key written in words (``passport number
  is X1234567``) or a one-word key of a number, a secret or a date of birth (``passport is
  X1234567``; :data:`_IS_LABELS`);
- a space, after a key of a number or a date of birth (``ssn 078-05-1120``, ``tax number 12 34 567
  890 123``, ``born 1985-03-12``, ``geboren am 12.03.1985``), looked for only in a text with five
  digits close together (the scrubber's test before it looks for numbers at all): its value has
  digits, and no other text pays for it; or with a digit and a word of a key of a date of birth
  (``born 12 March 1985``, ``born 12 March``, ``DOB 12/03``: a date in words, or without its year).

A space is any of :mod:`scrub_spaces` (a no-break space, a tab), or a run of them, around ``is``
too: ``ssn\u00a0078-05-1120``, ``ssn\tis 078-05-1120``.

`` is `` joins a key to its value less surely than ``:`` or ``=``: ``phone number is missing``,
``the card number is 16 digits long``, ``api key is 32 characters`` are remarks about a value,
not the value. The rule: after `` is `` or a space, a value is taken only when it reads as an
identifier — three digits or more in its first word and the groups of digits after it (``555
0134``, ``219 09 9999``), or two digits or more among letters in its first word (``X1234567``,
``1234567FA``) — and no unit follows its last digit (``100 characters``, ``10-15 digits``,
``16-digit``, ``256 bits``, ``100%``). After a space or `` is ``, a date of birth is taken as a date too
(``1985-03-12``, ``12 March 1985``, ``March 12, 1985``: the reader ``dob:`` uses); after a space only
as a date: a year alone names no one, so ``born 1985 in Paris`` and ``born in 1985`` keep it.
"""

from __future__ import annotations

import re

from jobsystem.privacy.scrub_keys import NUMBER_LABELS, SECRET_LABELS, KeyMatcher
from jobsystem.privacy.scrub_spaces import SPACE, SPACE_CHARS, space_run_start
from jobsystem.privacy.scrub_value_shapes import ONE_DIGIT_DAY, birth_date_end

__all__ = ["has_is", "joins", "reads_as_identifier", "separators"]

#: ``:`` and ``=``, looked for in every text that has one.
_SEPARATOR = re.compile(r"[:=]")
#: The separators and `` is ``, looked for in a text where a `` is `` follows a word that may end
#: a key (:func:`separators`). ``is`` is written as the key is, in any case: ``PASSPORT NUMBER IS``.
_SEPARATOR_OR_IS = re.compile(rf"[:={SPACE_CHARS}](?:(?<=[:=])|(?<!{SPACE}{SPACE}){SPACE}*+[iI][sS]{SPACE}+)")
#: `` is `` between spaces of any kind, in any case: a text with one may join a key to its value.
_IS = re.compile(rf"{SPACE}[iI][sS]{SPACE}")
#: The separators, `` is ``, and spaces after a letter (or the ``.`` of ``No.``, a ``#``) before
#: two digits close together in the next characters (``078-05-1120``, ``X1234567``, ``1 85 05``):
#: an identifier has them, a count does not (``attempt 3 of 5``, ``order 5)``: not looked at); or
#: before a day of one digit and a month's name (``1 March``); or before a word and a number, a
#: month's name first in a date (``March 12, 1985``). A run of spaces
#: is read from its first, once (``*+``): read again from each of its spaces, 64 KiB took minutes.
#: Both patterns start with one class of characters (not alternatives), so the engine skips to them.
_ANY_SEPARATOR = re.compile(
    rf"[:={SPACE_CHARS}](?:(?<=[:=])|(?<!{SPACE}{SPACE}){SPACE}*+[iI][sS]{SPACE}+"
    rf"|(?<=[^\W\d_]{SPACE}|[.#]{SPACE}){SPACE}*+"
    rf"(?=[A-Za-z]{{0,3}}[(+]?\d[\w\-./{SPACE_CHARS}]{{0,3}}\d|{ONE_DIGIT_DAY}|[^\W\d_]{{3,9}}\.?{SPACE}+\d))"
)
#: Labels whose one-word keys `` is `` joins to a value that reads as an identifier (``passport is
#: X1234567``, ``password is hunter22``); ``address is 10.0.0.5`` or ``name is Ana`` is a remark.
_IS_LABELS = NUMBER_LABELS | SECRET_LABELS | {"birth_date"}

#: The value's first word (after spaces), and the groups of digits a space after it (``0134``).
_RUN = re.compile(rf"{SPACE}*(\S+)((?:{SPACE}\d+(?:[\-./]\d+)*(?!\S))*)")
#: A space in a key's name: a key written in words.
_IN_WORDS = re.compile(SPACE)
#: A unit after a number's last digit: the number is a length, not a value. (``long`` and ``short``
#: are none: after a count of two digits they are a remark already, after an identifier a word.)
_UNIT = re.compile(
    rf"[\-{SPACE_CHARS}]*(?:(?:digits?|char(?:acter)?s?|letters?|symbols?|bytes?|bits?)(?![^\W\d_])|%)",
    re.IGNORECASE,
)


def has_is(text: str) -> bool:
    """Whether `` is `` (in any case, between spaces of any kind: :data:`_IS`) is in ``text``: between
    ASCII spaces (a run of them has one next to ``is``), looked for as substrings (a regular expression
    costs a line 0.3 us more); between others only in a text that may have them (not ASCII, a tab)."""
    if " is " in text or " IS " in text or " Is " in text or " iS " in text:
        return True
    return (not text.isascii() or "\t" in text) and _IS.search(text) is not None


def separators(text: str, keys: KeyMatcher, spaced: bool) -> re.Pattern[str] | None:
    """The separators to look for in ``text``: all of them if ``spaced`` (it has five digits close
    together, or a digit and a key of a date of birth: a date in words or without its year); else
    `` is `` too when one follows a word that may end a key in words (``number is``) or a one-word
    key of :data:`_IS_LABELS`; else ``:`` and ``=`` if there is one; else None.
    Other lines with `` is `` (``worker 3 is stopping``) are not scanned for it (a pattern with
    `` is `` costs a line of 70 characters some 1.3 us). An `` is `` at the text's start follows no
    word: the search goes on past it (a fragment such as `` is due; passport number is X1234567``)."""
    if spaced:
        return _ANY_SEPARATOR
    for written in _IS.finditer(text):
        at = start = space_run_start(text, written.start(), 0)
        while start > 0 and text[start - 1] not in SPACE_CHARS:
            start -= 1
        word = text[start:at]
        if keys.ends_phrase(word) or keys.label(word) in _IS_LABELS:
            return _SEPARATOR_OR_IS
    return _SEPARATOR if ":" in text or "=" in text else None


def joins(text: str, at: int, pos: int, name: str, label: str) -> bool:
    """Whether the weak separator ``text[at:pos]`` (`` is `` or spaces) joins the unquoted key
    ``name``, labelled ``label``, to the text after it (see the module)."""
    birth_date = label == "birth_date" and _reads_as_date(text, pos)
    if not text[at:pos].strip(SPACE_CHARS):  # spaces
        return reads_as_identifier(text, pos) if label in NUMBER_LABELS else birth_date
    return (label in _IS_LABELS or _IN_WORDS.search(name) is not None) and (
        birth_date or reads_as_identifier(text, pos)
    )


def reads_as_identifier(text: str, pos: int) -> bool:
    """Whether the text at ``pos``, after a key and a weak separator, reads as an identifier by
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


def _reads_as_date(text: str, pos: int) -> bool:
    """Whether a date of birth in a known shape, not a year alone, starts at ``pos``."""
    end = birth_date_end(text, pos)
    return end is not None and not text[pos:end].isdigit()
