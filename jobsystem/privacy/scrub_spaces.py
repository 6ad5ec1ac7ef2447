"""The characters read as a space in free text: between a key's words, around ``is``, between a key
and its value and between a value's parts.

A space is not always ASCII's: a spreadsheet, a PDF or a French text puts a no-break space
(U+00A0) before a colon and between words, French numbers are grouped by a narrow one (U+202F), a
TSV line or a log aligned by tabs has a tab, and several of them stand for one (``ssn\\u00a0078-05-1120``,
``date\\tof birth:``, ``passport  number:``). Each is one character, so a text read with them as
spaces keeps its positions.
"""

from __future__ import annotations

__all__ = ["SPACE", "SPACE_CHARS", "as_spaces", "space_run_start"]

#: The characters read as a space, for ``in`` tests.
SPACE_CHARS = " \t\u00a0\u202f"
#: The same, as a regular expression's class.
SPACE = r"[ \t\u00a0\u202f]"

_AS_SPACES = str.maketrans("\t\u00a0\u202f", "   ")


def as_spaces(text: str) -> str:
    """``text`` with each of its tabs and no-break spaces as an ASCII space; the same length."""
    return text.translate(_AS_SPACES) if "\t" in text or "\u00a0" in text or "\u202f" in text else text


def space_run_start(text: str, at: int, done: int) -> int:
    """Where the run of spaces ending at ``at`` starts (nothing before ``done``): ``at`` if none."""
    while at > done and text[at - 1] in SPACE_CHARS:
        at -= 1
    return at
